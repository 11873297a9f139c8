output "role_arn" {
  description = "ARN of the provisioning role; pass it to module broker-aws as provider_task_role_arn."
  value       = aws_iam_role.this.arn
}

output "role_name" {
  description = "Name of the provisioning role."
  value       = aws_iam_role.this.name
}

output "policy_arn" {
  description = "ARN of the least-privilege provisioning policy."
  value       = aws_iam_policy.provisioning.arn
}

output "policy_json" {
  description = "The provisioning policy document (JSON), for review."
  value       = data.aws_iam_policy_document.provisioning.json
}
