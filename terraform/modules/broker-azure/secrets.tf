# The broker CA, the MQTT server and gateway certificates, the admin token and the database URL in Key Vault.
# As in broker-aws, the CA key is also in the Terraform state: keep the state in an encrypted backend.

resource "tls_private_key" "ca" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "ca" {
  private_key_pem       = tls_private_key.ca.private_key_pem
  is_ca_certificate     = true
  validity_period_hours = 87600
  allowed_uses          = ["cert_signing", "crl_signing", "digital_signature"]

  subject {
    common_name  = "${var.name} hybrid-broker CA"
    organization = "hybrid-broker"
  }
}

resource "tls_private_key" "mqtt_server" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "mqtt_server" {
  private_key_pem = tls_private_key.mqtt_server.private_key_pem
  dns_names       = [azurerm_public_ip.mqtt.fqdn]
  ip_addresses    = [azurerm_public_ip.mqtt.ip_address, azurerm_network_interface.mqtt.private_ip_address]

  subject {
    common_name  = local.mqtt_public_host
    organization = "hybrid-broker"
  }
}

resource "tls_locally_signed_cert" "mqtt_server" {
  cert_request_pem      = tls_cert_request.mqtt_server.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 8760
  early_renewal_hours   = 720
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth"]
}

resource "tls_private_key" "gateway" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "gateway" {
  private_key_pem = tls_private_key.gateway.private_key_pem

  subject {
    common_name  = var.gateway_common_name
    organization = "hybrid-broker"
  }
}

resource "tls_locally_signed_cert" "gateway" {
  cert_request_pem      = tls_cert_request.gateway.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 8760
  early_renewal_hours   = 720
  allowed_uses          = ["digital_signature", "client_auth"]
}

resource "random_password" "db" {
  length  = 40
  special = false
}

resource "random_password" "admin_token" {
  length  = 48
  special = false
}

locals {
  secret_values = {
    "admin-token"  = random_password.admin_token.result
    "database-url" = "postgresql+psycopg://${azurerm_postgresql_flexible_server.broker.administrator_login}:${random_password.db.result}@${azurerm_postgresql_flexible_server.broker.fqdn}:5432/broker?sslmode=require"
    "ca-cert"      = tls_self_signed_cert.ca.cert_pem
    "ca-key"       = tls_private_key.ca.private_key_pem
    "mqtt-cert"    = "${tls_locally_signed_cert.mqtt_server.cert_pem}${tls_self_signed_cert.ca.cert_pem}"
    "mqtt-key"     = tls_private_key.mqtt_server.private_key_pem
    "gateway-cert" = "${tls_locally_signed_cert.gateway.cert_pem}${tls_self_signed_cert.ca.cert_pem}"
    "gateway-key"  = tls_private_key.gateway.private_key_pem
  }
}

resource "azurerm_key_vault" "broker" {
  #checkov:skip=CKV2_AZURE_32:Reached through service endpoints of the apps and mqtt subnets behind a deny-by-default firewall; a private endpoint would force terraform itself to run inside the VNet.
  name                          = "${var.name}-kv"
  location                      = var.location
  resource_group_name           = var.resource_group_name
  tenant_id                     = data.azurerm_client_config.current.tenant_id
  sku_name                      = "premium"
  enable_rbac_authorization     = true
  purge_protection_enabled      = true
  soft_delete_retention_days    = 90
  public_network_access_enabled = true
  tags                          = local.tags

  network_acls {
    default_action             = "Deny"
    bypass                     = "AzureServices"
    ip_rules                   = var.deployer_cidrs
    virtual_network_subnet_ids = [azurerm_subnet.apps.id, azurerm_subnet.mqtt.id]
  }
}

resource "azurerm_role_assignment" "deployer_secrets" {
  scope                = azurerm_key_vault.broker.id
  role_definition_name = "Key Vault Secrets Officer"
  principal_id         = data.azurerm_client_config.current.object_id
}

resource "azurerm_key_vault_secret" "this" {
  for_each = local.secret_values

  name            = each.key
  value           = each.value
  key_vault_id    = azurerm_key_vault.broker.id
  content_type    = endswith(each.key, "-cert") ? "application/x-pem-file" : "text/plain"
  expiration_date = timeadd(plantimestamp(), "8760h")
  tags            = local.tags

  lifecycle {
    ignore_changes = [expiration_date]
  }

  depends_on = [azurerm_role_assignment.deployer_secrets]
}

# The identity the container app reads its secrets with (the provisioning identity stays separate).
resource "azurerm_user_assigned_identity" "app" {
  name                = "${var.name}-app"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags
}

resource "azurerm_role_assignment" "app_secrets" {
  scope                = azurerm_key_vault.broker.id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.app.principal_id
}
