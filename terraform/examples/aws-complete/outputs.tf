# Everything `broker` clients and `edge-agent enroll` need:
#   export BROKER_URL=$(terraform output -raw api_url)
#   terraform output -raw ca_bundle_pem > ca.pem
#   edge-agent enroll --broker "$BROKER_URL" --token <token from `broker devices enroll-token`>

output "api_url" {
  description = "BROKER_URL for clients and --broker of `edge-agent enroll`."
  value       = module.broker.api_url
}

output "load_balancer_dns_name" {
  description = "Point the DNS name of api_domain_name here."
  value       = module.broker.load_balancer_dns_name
}

output "mqtt_url" {
  description = "MQTT endpoint (mqtts://host:8883) of the edge fleet."
  value       = module.broker.mqtt_url
}

output "ca_bundle_pem" {
  description = "CA bundle that verifies the MQTT server; devices trust it."
  value       = module.broker.ca_bundle_pem
}

output "admin_token_secret_arn" {
  description = "Secret holding BROKER_ADMIN_TOKEN (BROKER_TOKEN of admin clients)."
  value       = module.broker.admin_token_secret_arn
}

output "provisioner_role_arn" {
  description = "The least-privilege role the broker provisions EC2 instances with."
  value       = module.provisioner.role_arn
}
