# What `broker` clients, `edge-agent enroll` and operators need. Names follow the configuration keys:
# api_url is BROKER_URL for clients and the --broker of `edge-agent enroll`; mqtt_url is the device-facing
# BROKER_MQTT_URL; ca_bundle_pem verifies both the MQTT server and device certificates.

output "api_url" {
  description = "BROKER_URL for `broker submit` / `broker jobs` and --broker of `edge-agent enroll`."
  value       = local.api_url
}

output "load_balancer_dns_name" {
  description = "DNS name of the load balancer; point api_domain_name at it (CNAME or alias)."
  value       = aws_lb.api.dns_name
}

output "mqtt_url" {
  description = "mqtts://host:8883 that edge devices connect to."
  value       = local.mqtt_url
}

output "mqtt_internal_url" {
  description = "BROKER_MQTT_URL the broker gateway inside the VPC uses."
  value       = local.mqtt_internal_url
}

output "mqtt_public_ip" {
  description = "Public IP address of the Mosquitto host (for a DNS record named mqtt_domain_name)."
  value       = aws_eip.mqtt.public_ip
}

output "ca_bundle_pem" {
  description = "CA bundle (PEM) of this installation: verifies the MQTT server certificate; devices trust it."
  value       = tls_self_signed_cert.ca.cert_pem
}

output "ca_bundle_secret_arn" {
  description = "Secrets Manager ARN holding the same CA bundle."
  value       = aws_secretsmanager_secret.ca_cert.arn
}

output "admin_token_secret_arn" {
  description = "Secrets Manager ARN of BROKER_ADMIN_TOKEN; read it with `aws secretsmanager get-secret-value`."
  value       = aws_secretsmanager_secret.admin_token.arn
}

output "database_url_secret_arn" {
  description = "Secrets Manager ARN of BROKER_DATABASE_URL."
  value       = aws_secretsmanager_secret.database_url.arn
}

output "database_endpoint" {
  description = "host:port of PostgreSQL (private)."
  value       = aws_db_instance.broker.endpoint
}

output "ecs_cluster_name" {
  description = "ECS cluster of the API replicas."
  value       = aws_ecs_cluster.broker.name
}

output "ecs_service_name" {
  description = "ECS service of the API replicas (scale with api_replicas)."
  value       = aws_ecs_service.broker.name
}

output "task_security_group_id" {
  description = "Security group of the API tasks."
  value       = aws_security_group.tasks.id
}

output "kms_key_arn" {
  description = "KMS key encrypting the secrets, database, logs and disks."
  value       = aws_kms_key.broker.arn
}

output "log_group_names" {
  description = "CloudWatch log groups of the API and of Mosquitto."
  value       = { api = aws_cloudwatch_log_group.api.name, mqtt = aws_cloudwatch_log_group.mqtt.name }
}
