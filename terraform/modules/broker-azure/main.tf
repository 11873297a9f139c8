# broker-azure: the hybrid-broker service on Azure, the same shape as broker-aws.
#
#   clients --443/TLS--> Container Apps ingress (IP allow-list) --> `broker serve` replicas --> PostgreSQL
#   Flexible Server (private, delegated subnet); devices --8883/mTLS--> Mosquitto VM <-- broker gateway.
#
# Secrets live in Key Vault; the container app reads them with its own managed identity, as environment
# secrets (BROKER_DATABASE_URL, BROKER_ADMIN_TOKEN) and as files in a secret volume (the *_FILE keys).

data "azurerm_client_config" "current" {}

locals {
  tags        = merge(var.tags, { "hb-component" = "broker" })
  data_dir    = "/var/lib/hybrid-broker"
  secrets_dir = "/run/hybrid-broker"

  api_url           = "https://${azurerm_container_app.broker.ingress[0].fqdn}"
  mqtt_public_host  = azurerm_public_ip.mqtt.fqdn
  mqtt_url          = "mqtts://${local.mqtt_public_host}:8883"
  mqtt_internal_url = "mqtts://${azurerm_network_interface.mqtt.private_ip_address}:8883"

  # Configuration keys of `broker serve` (docs/CONFIG.md) set as plain environment variables.
  broker_environment_base = {
    BROKER_HOST                         = "0.0.0.0"
    BROKER_PORT                         = tostring(var.broker_port)
    BROKER_DATA_DIR                     = local.data_dir
    BROKER_PROVIDERS                    = var.broker_providers
    BROKER_LOG_LEVEL                    = var.broker_log_level
    BROKER_SCHEDULER_INTERVAL_SECONDS   = tostring(var.broker_scheduler_interval_seconds)
    BROKER_SCHEDULER_LAUNCH_CONCURRENCY = tostring(var.broker_scheduler_launch_concurrency)
    BROKER_LAUNCH_RETRY_WAIT_SECONDS    = tostring(var.broker_launch_retry_wait_seconds)
    BROKER_MAX_BODY_BYTES               = tostring(var.broker_max_body_bytes)
    BROKER_MQTT_URL                     = local.mqtt_internal_url
    BROKER_MQTT_CA_FILE                 = "${local.secrets_dir}/ca-cert"
    BROKER_MQTT_CERT_FILE               = "${local.secrets_dir}/gateway-cert"
    BROKER_MQTT_KEY_FILE                = "${local.secrets_dir}/gateway-key"
    BROKER_CA_KEY_FILE                  = "${local.secrets_dir}/ca-key"
  }

  broker_environment_optional = {
    BROKER_CATALOG_DIR   = var.broker_catalog_dir
    BROKER_INVENTORY     = var.broker_inventory
    BROKER_EGRESS_CONFIG = var.broker_egress_config
    # Scheduling policies (docs/POLICIES.md): gang layout and load balancing across equivalent pools.
    BROKER_GANG_SPREAD              = var.broker_gang_spread
    BROKER_LOAD_BALANCING           = var.broker_load_balancing
    BROKER_LOAD_BALANCING_TOLERANCE = var.broker_load_balancing_tolerance == null ? null : tostring(var.broker_load_balancing_tolerance)
  }

  broker_environment = merge(
    local.broker_environment_base,
    { for key, value in local.broker_environment_optional : key => value if value != null },
    var.provider_identity_client_id == null ? {} : { AZURE_CLIENT_ID = var.provider_identity_client_id },
    var.extra_environment,
  )

  # Configuration keys read from Key Vault (environment name => container app secret name).
  broker_secrets = {
    BROKER_DATABASE_URL = "database-url"
    BROKER_ADMIN_TOKEN  = "admin-token"
  }

  # Secrets mounted as files in local.secrets_dir (the file name is the secret name).
  secret_files = ["ca-cert", "ca-key", "gateway-cert", "gateway-key"]
}

resource "azurerm_log_analytics_workspace" "broker" {
  name                = "${var.name}-logs"
  location            = var.location
  resource_group_name = var.resource_group_name
  sku                 = "PerGB2018"
  retention_in_days   = var.log_retention_days
  tags                = local.tags
}
