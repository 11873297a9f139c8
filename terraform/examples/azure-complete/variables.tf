variable "location" {
  description = "Azure region the broker runs in."
  type        = string
  default     = "westeurope"
}

variable "name" {
  description = "Name prefix (3-16 lowercase letters or digits)."
  type        = string
  default     = "hybridbroker"
}

variable "image" {
  description = "Container image of the broker."
  type        = string
}

variable "api_replicas" {
  description = "Number of API replicas."
  type        = number
  default     = 2
}

variable "allowed_api_cidrs" {
  description = "Who may reach the API on 443."
  type        = list(string)
}

variable "device_cidrs" {
  description = "Who may reach MQTT on 8883."
  type        = list(string)
}

variable "deployer_cidrs" {
  description = "Public CIDR of the machine running terraform (through the Key Vault firewall)."
  type        = list(string)
}

variable "mqtt_admin_ssh_public_key" {
  description = "SSH public key of the MQTT host's admin user."
  type        = string
}

variable "broker_providers" {
  description = "BROKER_PROVIDERS: providers the scheduler may provision on."
  type        = string
  default     = "onprem,aws,azure,gcp"
}
