variable "name" {
  description = "Name of the managed identity and prefix of the role definitions."
  type        = string
  default     = "hybrid-broker-provisioner"
}

variable "location" {
  description = "Azure region of the user-assigned managed identity."
  type        = string
}

variable "identity_resource_group_name" {
  description = "Resource group that holds the managed identity."
  type        = string
}

variable "subscription_id" {
  description = "Subscription the broker reads VM sizes and SKUs of (/subscriptions/<id>)."
  type        = string
}

variable "workload_resource_group_id" {
  description = "ID of the resource group the broker launches its VMs in; the lifecycle permissions apply there only."
  type        = string
}

variable "create_service_principal" {
  description = "Also create an app registration with a client secret, for a broker running outside Azure (AZURE_CLIENT_ID / AZURE_TENANT_ID / AZURE_CLIENT_SECRET)."
  type        = bool
  default     = false
}

variable "client_secret_expiry_hours" {
  description = "Lifetime of the service principal's client secret in hours (when create_service_principal)."
  type        = number
  default     = 4320
}

variable "tags" {
  description = "Tags added to the managed identity."
  type        = map(string)
  default     = {}
}
