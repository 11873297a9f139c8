output "service_account_email" {
  description = "Email of the provisioning service account; create a key for it (GOOGLE_APPLICATION_CREDENTIALS) or use workload identity federation."
  value       = google_service_account.this.email
}

output "read_role_id" {
  description = "Custom role with the read permissions."
  value       = google_project_iam_custom_role.read.id
}

output "lifecycle_role_id" {
  description = "Custom role with the lifecycle permissions."
  value       = google_project_iam_custom_role.lifecycle.id
}
