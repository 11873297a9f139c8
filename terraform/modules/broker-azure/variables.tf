# Inputs of the broker-azure module. Variables named broker_<key> set the broker's configuration key
# BROKER_<KEY> (docs/CONFIG.md); their defaults are the documented ones (tests/terraform checks this).

variable "name" {
  description = "Name prefix of every resource (lowercase letters and digits, 3-16 characters: Key Vault and PostgreSQL names derive from it)."
  type        = string
  default     = "hybridbroker"

  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,15}$", var.name))
    error_message = "name must be 3-16 lowercase letters or digits, starting with a letter."
  }
}

variable "location" {
  description = "Azure region, e.g. westeurope."
  type        = string
}

variable "resource_group_name" {
  description = "Existing resource group the broker is deployed into."
  type        = string
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}

variable "address_space" {
  description = "Address space of the broker's virtual network (a /16 leaves room for its three subnets)."
  type        = string
  default     = "10.42.0.0/16"
}

variable "image" {
  description = "Container image of the broker (runs `broker serve`)."
  type        = string
}

variable "api_replicas" {
  description = "Number of API replicas. All share the one PostgreSQL; one of them is the scheduler leader at a time."
  type        = number
  default     = 2

  validation {
    condition     = var.api_replicas >= 1 && var.api_replicas <= 30
    error_message = "api_replicas must be between 1 and 30."
  }
}

variable "replica_cpu" {
  description = "vCPUs of one API replica (Container Apps sizes: 0.5, 1, 2...)."
  type        = number
  default     = 1
}

variable "replica_memory" {
  description = "Memory of one API replica, matching replica_cpu (e.g. 2Gi for 1 vCPU)."
  type        = string
  default     = "2Gi"
}

variable "allowed_api_cidrs" {
  description = "CIDR blocks allowed to reach the API on port 443."
  type        = list(string)
}

variable "device_cidrs" {
  description = "CIDR blocks of edge devices allowed to reach MQTT on port 8883."
  type        = list(string)
}

variable "deployer_cidrs" {
  description = "CIDR blocks of the machine running terraform, allowed through the Key Vault firewall to write the secrets."
  type        = list(string)
  default     = []
}

variable "db_sku_name" {
  description = "SKU of the PostgreSQL Flexible Server."
  type        = string
  default     = "GP_Standard_D2ds_v5"
}

variable "db_storage_mb" {
  description = "Storage of PostgreSQL in MB."
  type        = number
  default     = 32768
}

variable "db_version" {
  description = "PostgreSQL major version."
  type        = string
  default     = "16"
}

variable "db_backup_retention_days" {
  description = "Days of PostgreSQL backups (7-35)."
  type        = number
  default     = 14
}

variable "db_geo_redundant_backup" {
  description = "Keep PostgreSQL backups geo-redundant."
  type        = bool
  default     = true
}

variable "db_high_availability" {
  description = "Run a zone-redundant standby of PostgreSQL."
  type        = bool
  default     = true
}

variable "mqtt_vm_size" {
  description = "VM size of the Mosquitto host."
  type        = string
  default     = "Standard_B2s"
}

variable "mqtt_image" {
  description = "Container image of Mosquitto run on the MQTT host."
  type        = string
  default     = "eclipse-mosquitto:2.0"
}

variable "mqtt_admin_ssh_public_key" {
  description = "SSH public key of the MQTT host's admin user (no port is opened for SSH; use Azure Bastion or the serial console)."
  type        = string
}

variable "gateway_common_name" {
  description = "Common name of the broker gateway's MQTT client certificate; Mosquitto's ACL lets this identity read and write every device topic."
  type        = string
  default     = "hb-gateway"
}

variable "log_retention_days" {
  description = "Days Log Analytics keeps the broker's logs."
  type        = number
  default     = 365
}

variable "provider_identity_id" {
  description = "Resource ID of the least-privilege provisioning identity (module provider-identity-azure, output identity_id). null = Azure runs in dry-run mode."
  type        = string
  default     = null
}

variable "provider_identity_client_id" {
  description = "Client ID of that identity (output client_id), set as AZURE_CLIENT_ID."
  type        = string
  default     = null
}

variable "extra_environment" {
  description = "Extra environment variables of the broker container (e.g. AZURE_SUBSCRIPTION_ID)."
  type        = map(string)
  default     = {}
}

# --- broker configuration keys (docs/CONFIG.md) -------------------------------------------------

variable "broker_port" {
  description = "BROKER_PORT: the port `broker serve` listens on inside the container (the ingress target port)."
  type        = number
  default     = 8080
}

variable "broker_providers" {
  description = "BROKER_PROVIDERS: providers the scheduler may provision on; clouds without credentials run in dry-run mode."
  type        = string
  default     = "onprem,aws,azure,gcp"
}

variable "broker_log_level" {
  description = "BROKER_LOG_LEVEL: log level of the broker."
  type        = string
  default     = "INFO"
}

variable "broker_scheduler_interval_seconds" {
  description = "BROKER_SCHEDULER_INTERVAL_SECONDS: time between scheduler cycles."
  type        = number
  default     = 1.0
}

variable "broker_launch_retry_wait_seconds" {
  description = "BROKER_LAUNCH_RETRY_WAIT_SECONDS: the most one job's launch sleeps between transient retries in a scheduler cycle."
  type        = number
  default     = 10
}

variable "broker_scheduler_launch_concurrency" {
  description = "BROKER_SCHEDULER_LAUNCH_CONCURRENCY: launches the scheduler leader has in flight at once (1..64)."
  type        = number
  default     = 1
}

variable "broker_max_body_bytes" {
  description = "BROKER_MAX_BODY_BYTES: largest accepted request body (HTTP 413 beyond)."
  type        = number
  default     = 1048576
}

variable "broker_catalog_dir" {
  description = "BROKER_CATALOG_DIR: directory (inside the image) of catalogs in SkyPilot's v8 layout merged over the embedded one. null = unset."
  type        = string
  default     = null
}

variable "broker_inventory" {
  description = "BROKER_INVENTORY: on-prem inventory file (YAML) inside the image. null = unset (only localhost)."
  type        = string
  default     = null
}

variable "broker_egress_config" {
  description = "BROKER_EGRESS_CONFIG: YAML file inside the image overriding egress $/GB and bandwidth per site. null = unset."
  type        = string
  default     = null
}

variable "broker_gang_spread" {
  description = "BROKER_GANG_SPREAD: layout of gang jobs not asking sameZone, pack or spread. null = unset (pack)."
  type        = string
  default     = "pack"

  validation {
    condition     = var.broker_gang_spread == null || contains(["pack", "spread"], coalesce(var.broker_gang_spread, "pack"))
    error_message = "broker_gang_spread must be pack or spread."
  }
}

variable "broker_load_balancing" {
  description = "BROKER_LOAD_BALANCING: plugin choosing among equivalent options: none, round-robin, least-loaded, performance, predictive, or weights like least-loaded:1,performance:2. null = unset (least-loaded)."
  type        = string
  default     = "least-loaded"
}

variable "broker_load_balancing_tolerance" {
  description = "BROKER_LOAD_BALANCING_TOLERANCE: options within this fraction of the best total cost are equivalent (0.01 = 1 %). null = unset (0.01)."
  type        = number
  default     = 0.01
}
