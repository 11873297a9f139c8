# broker-aws: the hybrid-broker service on AWS.
#
#   clients --443/TLS--> ALB --> ECS Fargate tasks (`broker serve`, N replicas) --> RDS PostgreSQL
#   devices --8883/mTLS--> Mosquitto on EC2 <--8883/mTLS-- broker gateway (inside the tasks)
#
# Secrets (admin token, database URL, the CA's key and the gateway's MQTT key) live in Secrets Manager,
# encrypted with this module's KMS key, and reach the broker as the environment keys of docs/CONFIG.md.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  tags = merge(var.tags, { "hb-component" = "broker" })

  data_dir    = "/var/lib/hybrid-broker"
  secrets_dir = "/run/hybrid-broker"

  api_host          = coalesce(var.api_domain_name, aws_lb.api.dns_name)
  api_url           = "https://${local.api_host}"
  mqtt_public_host  = coalesce(var.mqtt_domain_name, aws_eip.mqtt.public_dns)
  mqtt_url          = "mqtts://${local.mqtt_public_host}:8883"
  mqtt_internal_url = "mqtts://${aws_network_interface.mqtt.private_ip}:8883"

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
    BROKER_MQTT_CA_FILE                 = "${local.secrets_dir}/ca.pem"
    BROKER_MQTT_CERT_FILE               = "${local.secrets_dir}/gateway.pem"
    BROKER_MQTT_KEY_FILE                = "${local.secrets_dir}/gateway.key"
    BROKER_CA_KEY_FILE                  = "${local.secrets_dir}/ca.key"
  }

  # Optional keys: set only when the variable is not null.
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
    var.extra_environment,
  )

  # Configuration keys read from Secrets Manager by ECS when a task starts.
  broker_secrets = {
    BROKER_DATABASE_URL = aws_secretsmanager_secret.database_url.arn
    BROKER_ADMIN_TOKEN  = aws_secretsmanager_secret.admin_token.arn
  }

  # Files the init container writes into the tasks' in-memory secrets volume (file name => secret ARN).
  secret_files = {
    "ca.pem"      = aws_secretsmanager_secret.ca_cert.arn
    "ca.key"      = aws_secretsmanager_secret.ca_key.arn
    "gateway.pem" = aws_secretsmanager_secret.gateway_cert.arn
    "gateway.key" = aws_secretsmanager_secret.gateway_key.arn
  }
}
