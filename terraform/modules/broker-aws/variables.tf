# Inputs of the broker-aws module. Variables named broker_<key> set the broker's configuration key
# BROKER_<KEY> (docs/CONFIG.md); their defaults are the documented ones (tests/terraform checks this).

variable "name" {
  description = "Name prefix of every resource (letters, digits and hyphens)."
  type        = string
  default     = "hybrid-broker"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,30}$", var.name))
    error_message = "name must be 2-31 lowercase letters, digits or hyphens, starting with a letter."
  }
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}

variable "vpc_id" {
  description = "VPC the broker runs in."
  type        = string
}

variable "public_subnet_ids" {
  description = "Public subnets (two or more availability zones) for the load balancer and the MQTT broker's address."
  type        = list(string)
}

variable "private_subnet_ids" {
  description = "Private subnets (two or more availability zones, with a route to the internet through NAT) for the API tasks and PostgreSQL."
  type        = list(string)
}

variable "image" {
  description = "Container image of the broker (runs `broker serve`), e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/hybrid-broker:0.1.0."
  type        = string
}

variable "api_replicas" {
  description = "Number of API replicas (ECS tasks). All share the one PostgreSQL; one of them is the scheduler leader at a time."
  type        = number
  default     = 2

  validation {
    condition     = var.api_replicas >= 1
    error_message = "api_replicas must be at least 1."
  }
}

variable "task_cpu" {
  description = "CPU units of one API task (1024 = 1 vCPU)."
  type        = number
  default     = 1024
}

variable "task_memory_mib" {
  description = "Memory of one API task in MiB."
  type        = number
  default     = 2048
}

variable "certificate_arn" {
  description = "ACM certificate ARN for the HTTPS listener of the load balancer (the API's DNS name)."
  type        = string
}

variable "api_domain_name" {
  description = "DNS name clients use for the API (a CNAME/alias to the load balancer you create). null = the load balancer's own DNS name."
  type        = string
  default     = null
}

variable "allowed_api_cidrs" {
  description = "CIDR blocks allowed to reach the API on port 443."
  type        = list(string)
}

variable "device_cidrs" {
  description = "CIDR blocks of edge devices allowed to reach MQTT on port 8883."
  type        = list(string)
}

variable "load_balancer_deletion_protection" {
  description = "Protect the load balancer from deletion."
  type        = bool
  default     = true
}

variable "alb_access_logs_bucket" {
  description = "S3 bucket receiving the load balancer's access logs (the bucket policy must allow the ELB log delivery). null = access logs off."
  type        = string
  default     = null
}

variable "waf_web_acl_arn" {
  description = "WAFv2 web ACL to associate with the load balancer. null = none."
  type        = string
  default     = null
}

variable "db_instance_class" {
  description = "RDS instance class of PostgreSQL."
  type        = string
  default     = "db.t4g.medium"
}

variable "db_allocated_storage_gib" {
  description = "Initial storage of PostgreSQL in GiB (grows automatically up to 10x)."
  type        = number
  default     = 20
}

variable "db_engine_version" {
  description = "PostgreSQL major version."
  type        = string
  default     = "16"
}

variable "db_multi_az" {
  description = "Run PostgreSQL with a standby in a second availability zone."
  type        = bool
  default     = true
}

variable "db_backup_retention_days" {
  description = "Days of automated PostgreSQL backups (point-in-time recovery)."
  type        = number
  default     = 14

  validation {
    condition     = var.db_backup_retention_days >= 1
    error_message = "Backups must stay on: db_backup_retention_days must be at least 1."
  }
}

variable "db_deletion_protection" {
  description = "Protect the PostgreSQL instance from deletion (turn off only to destroy a test installation)."
  type        = bool
  default     = true
}

variable "mqtt_instance_type" {
  description = "EC2 instance type of the Mosquitto host."
  type        = string
  default     = "t3.small"
}

variable "mqtt_image" {
  description = "Container image of Mosquitto run on the MQTT host."
  type        = string
  default     = "public.ecr.aws/docker/library/eclipse-mosquitto:2.0"
}

variable "mqtt_domain_name" {
  description = "Extra DNS name put in the MQTT server certificate (for a DNS record you point at mqtt_public_ip). null = none."
  type        = string
  default     = null
}

variable "gateway_common_name" {
  description = "Common name of the broker gateway's MQTT client certificate; Mosquitto's ACL lets this identity read and write every device topic."
  type        = string
  default     = "hb-gateway"
}

variable "log_retention_days" {
  description = "Days CloudWatch keeps the broker's and Mosquitto's logs."
  type        = number
  default     = 365
}

variable "provider_task_role_arn" {
  description = "IAM role the API tasks run as: the least-privilege provisioning identity (module provider-identity-aws, output role_arn). null = a role without cloud permissions (AWS then runs in dry-run mode)."
  type        = string
  default     = null
}

variable "extra_environment" {
  description = "Extra environment variables of the broker container (cloud credentials of other clouds, e.g. AZURE_CLIENT_ID). Secrets belong in extra_secret_arns."
  type        = map(string)
  default     = {}
}

variable "extra_secret_arns" {
  description = "Extra environment variables of the broker container read from Secrets Manager: name => secret ARN (e.g. AZURE_CLIENT_SECRET)."
  type        = map(string)
  default     = {}
}

variable "init_image" {
  description = "Small image with a POSIX shell used by the init container that writes the PEM secrets to files."
  type        = string
  default     = "public.ecr.aws/docker/library/busybox:1.36"
}

variable "container_uid" {
  description = "Numeric user id the broker container runs as; the PEM files are owned by it (mode 0400)."
  type        = number
  default     = 10001
}

# --- broker configuration keys (docs/CONFIG.md) -------------------------------------------------

variable "broker_port" {
  description = "BROKER_PORT: the port `broker serve` listens on inside the task (the load balancer's target port)."
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
