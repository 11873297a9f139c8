output "api_url" {
  description = "BROKER_URL for clients and --broker of `edge-agent enroll`."
  value       = module.broker.api_url
}

output "mqtt_url" {
  description = "MQTT endpoint (mqtts://host:8883) of the edge fleet."
  value       = module.broker.mqtt_url
}

output "ca_bundle_pem" {
  description = "CA bundle that verifies the MQTT server; devices trust it."
  value       = module.broker.ca_bundle_pem
}

output "admin_token_secret_id" {
  description = "Key Vault secret of BROKER_ADMIN_TOKEN (BROKER_TOKEN of admin clients)."
  value       = module.broker.admin_token_secret_id
}

output "provisioner_client_id" {
  description = "Client ID of the least-privilege identity the broker provisions Azure VMs with."
  value       = module.provisioner.client_id
}
