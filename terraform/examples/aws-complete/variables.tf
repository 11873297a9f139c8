variable "region" {
  description = "AWS region the broker runs in."
  type        = string
  default     = "eu-west-1"
}

variable "name" {
  description = "Name prefix of every resource."
  type        = string
  default     = "hybrid-broker"
}

variable "vpc_cidr" {
  description = "CIDR of the VPC created for the broker (two public and two private /20 subnets are cut from it)."
  type        = string
  default     = "10.40.0.0/16"
}

variable "image" {
  description = "Container image of the broker, e.g. <account>.dkr.ecr.<region>.amazonaws.com/hybrid-broker:0.1.0."
  type        = string
}

variable "api_replicas" {
  description = "Number of API replicas (ECS tasks)."
  type        = number
  default     = 2
}

variable "certificate_arn" {
  description = "ACM certificate for the API's DNS name (api_domain_name)."
  type        = string
}

variable "api_domain_name" {
  description = "DNS name of the API (point it at the output load_balancer_dns_name). null = use the load balancer's name."
  type        = string
  default     = null
}

variable "allowed_api_cidrs" {
  description = "Who may reach the API on 443."
  type        = list(string)
}

variable "device_cidrs" {
  description = "Who may reach MQTT on 8883 (edge devices' public addresses)."
  type        = list(string)
}

variable "db_deletion_protection" {
  description = "Protect PostgreSQL from deletion; set false only for a throwaway installation."
  type        = bool
  default     = true
}

variable "allowed_regions" {
  description = "Regions the broker may launch instances in. Empty = all."
  type        = list(string)
  default     = []
}

variable "broker_providers" {
  description = "BROKER_PROVIDERS: providers the scheduler may provision on."
  type        = string
  default     = "onprem,aws,azure,gcp"
}

variable "broker_log_level" {
  description = "BROKER_LOG_LEVEL of the broker."
  type        = string
  default     = "INFO"
}
