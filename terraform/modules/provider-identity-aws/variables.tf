variable "name" {
  description = "Name of the IAM role and policy."
  type        = string
  default     = "hybrid-broker-provisioner"
}

variable "tags" {
  description = "Tags added to the role and policy."
  type        = map(string)
  default     = {}
}

variable "trusted_services" {
  description = "AWS services that may assume the role (ECS tasks run the broker in module broker-aws; add ec2.amazonaws.com for a broker on an instance)."
  type        = list(string)
  default     = ["ecs-tasks.amazonaws.com"]
}

variable "trusted_role_arns" {
  description = "IAM roles or users that may assume the role (e.g. a broker running outside AWS with its own credentials)."
  type        = list(string)
  default     = []
}

variable "scope_tag_key" {
  description = "Tag every instance the broker launches carries (providers set hb-job on launch); launching requires it and terminating or re-tagging is allowed only on instances that carry it."
  type        = string
  default     = "hb-job"
}

variable "allowed_regions" {
  description = "Regions the broker may launch in (aws:RequestedRegion). Empty = every region."
  type        = list(string)
  default     = []
}

variable "subnet_arns" {
  description = "Subnets instances may be launched into. Empty = any subnet of the account."
  type        = list(string)
  default     = []
}

variable "permissions_boundary_arn" {
  description = "Permissions boundary attached to the role, if your organisation requires one."
  type        = string
  default     = null
}
