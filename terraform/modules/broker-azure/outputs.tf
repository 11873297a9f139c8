# What `broker` clients, `edge-agent enroll` and operators need (same names as module broker-aws).

output "api_url" {
  description = "BROKER_URL for `broker submit` / `broker jobs` and --broker of `edge-agent enroll`."
  value       = local.api_url
}

output "mqtt_url" {
  description = "mqtts://host:8883 that edge devices connect to."
  value       = local.mqtt_url
}

output "mqtt_internal_url" {
  description = "BROKER_MQTT_URL the broker gateway inside the virtual network uses."
  value       = local.mqtt_internal_url
}

output "mqtt_public_ip" {
  description = "Public IP address of the Mosquitto host."
  value       = azurerm_public_ip.mqtt.ip_address
}

output "ca_bundle_pem" {
  description = "CA bundle (PEM) of this installation: verifies the MQTT server certificate; devices trust it."
  value       = tls_self_signed_cert.ca.cert_pem
}

output "key_vault_name" {
  description = "Key Vault holding admin-token, database-url, ca-cert, ca-key and the MQTT certificates."
  value       = azurerm_key_vault.broker.name
}

output "admin_token_secret_id" {
  description = "Key Vault secret ID of BROKER_ADMIN_TOKEN; read it with `az keyvault secret show --id`."
  value       = azurerm_key_vault_secret.this["admin-token"].versionless_id
}

output "database_fqdn" {
  description = "Private FQDN of PostgreSQL."
  value       = azurerm_postgresql_flexible_server.broker.fqdn
}

output "container_app_name" {
  description = "Container app of the API replicas (scale with api_replicas)."
  value       = azurerm_container_app.broker.name
}
