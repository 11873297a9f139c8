output "identity_id" {
  description = "Resource ID of the user-assigned managed identity (attach it to the broker's container app)."
  value       = azurerm_user_assigned_identity.this.id
}

output "client_id" {
  description = "AZURE_CLIENT_ID of the managed identity."
  value       = azurerm_user_assigned_identity.this.client_id
}

output "principal_id" {
  description = "Object ID of the managed identity's service principal."
  value       = azurerm_user_assigned_identity.this.principal_id
}

output "tenant_id" {
  description = "AZURE_TENANT_ID."
  value       = azurerm_user_assigned_identity.this.tenant_id
}

output "service_principal_client_id" {
  description = "AZURE_CLIENT_ID of the optional service principal (null when create_service_principal is false)."
  value       = try(azuread_application.this[0].client_id, null)
}

output "service_principal_client_secret" {
  description = "AZURE_CLIENT_SECRET of the optional service principal (null when create_service_principal is false)."
  value       = try(azuread_service_principal_password.this[0].value, null)
  sensitive   = true
}
