variable "project_id" {
  description = "GCP project the broker launches instances in (GOOGLE_CLOUD_PROJECT). A project dedicated to broker workloads is the tightest scope GCP offers for these permissions."
  type        = string
}

variable "account_id" {
  description = "Account id of the service account (6-30 lowercase letters, digits, hyphens)."
  type        = string
  default     = "hybrid-broker-provisioner"
}

variable "role_id" {
  description = "Id of the custom role (letters, digits, underscores, periods)."
  type        = string
  default     = "hybridBrokerProvisioner"
}

variable "instance_name_prefix" {
  description = "Prefix of the instance names the broker creates; the lifecycle permissions are granted under an IAM condition on it. Empty = no condition."
  type        = string
  default     = "hb-"
}

variable "workload_identity_principals" {
  description = "Federated principals allowed to impersonate the service account (roles/iam.workloadIdentityUser), e.g. principalSet://iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/POOL/attribute.aws_role/arn:aws:sts::ACCOUNT:assumed-role/ROLE. Empty = none (use a key or ADC)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for p in var.workload_identity_principals : can(regex("^principal(Set)?://iam\\.googleapis\\.com/", p))])
    error_message = "Each principal must be a principal:// or principalSet:// identifier of a workload identity pool."
  }
}
