# provider-identity-azure: the identity hybrid-broker's Azure adapter (providers/azure.py) provisions with.
#
# Two custom roles hold exactly the operations providers/ makes (README.md lists each one with its code
# path; tests/terraform derives them from the code through azure-mgmt-compute's request URLs):
#   * catalog reads that Azure serves per subscription (SKUs, VM sizes): assigned on the subscription;
#   * the VM lifecycle (VMs, their NICs and OS disks, the adapter's VNet, boot diagnostics of its VMs, the
#     resource group itself): assigned on the one workload resource group.

resource "azurerm_user_assigned_identity" "this" {
  name                = var.name
  location            = var.location
  resource_group_name = var.identity_resource_group_name
  tags                = var.tags
}

resource "azurerm_role_definition" "catalog" {
  name        = "${var.name}-catalog"
  scope       = "/subscriptions/${var.subscription_id}"
  description = "hybrid-broker: read VM sizes and SKUs (capabilities, restrictions) for placement"

  permissions {
    actions = [
      "Microsoft.Compute/locations/vmSizes/read",
      "Microsoft.Compute/skus/read",
    ]
    not_actions = []
  }

  assignable_scopes = ["/subscriptions/${var.subscription_id}"]
}

resource "azurerm_role_definition" "lifecycle" {
  name        = "${var.name}-lifecycle"
  scope       = var.workload_resource_group_id
  description = "hybrid-broker: create, read and delete its VMs, their NICs, VNet and disks, add the NVIDIA GPU driver extension to GPU VMs, and read their boot diagnostics, in one resource group"

  permissions {
    actions = [
      "Microsoft.Compute/disks/delete",
      "Microsoft.Compute/disks/read",
      "Microsoft.Compute/virtualMachines/delete",
      "Microsoft.Compute/virtualMachines/extensions/write",
      "Microsoft.Compute/virtualMachines/read",
      "Microsoft.Compute/virtualMachines/retrieveBootDiagnosticsData/action",
      "Microsoft.Compute/virtualMachines/write",
      "Microsoft.Network/networkInterfaces/delete",
      "Microsoft.Network/networkInterfaces/join/action",
      "Microsoft.Network/networkInterfaces/read",
      "Microsoft.Network/networkInterfaces/write",
      "Microsoft.Network/virtualNetworks/read",
      "Microsoft.Network/virtualNetworks/subnets/join/action",
      "Microsoft.Network/virtualNetworks/write",
      "Microsoft.Resources/subscriptions/resourceGroups/read",
      "Microsoft.Resources/subscriptions/resourceGroups/write",
    ]
    not_actions = []
  }

  assignable_scopes = [var.workload_resource_group_id]
}

locals {
  principals = merge(
    { managed_identity = azurerm_user_assigned_identity.this.principal_id },
    var.create_service_principal ? { service_principal = azuread_service_principal.this[0].object_id } : {},
  )
}

resource "azurerm_role_assignment" "catalog" {
  for_each = toset(keys(local.principals))

  scope              = "/subscriptions/${var.subscription_id}"
  role_definition_id = azurerm_role_definition.catalog.role_definition_resource_id
  principal_id       = local.principals[each.key]
}

resource "azurerm_role_assignment" "lifecycle" {
  for_each = toset(keys(local.principals))

  scope              = var.workload_resource_group_id
  role_definition_id = azurerm_role_definition.lifecycle.role_definition_resource_id
  principal_id       = local.principals[each.key]
}

data "azuread_client_config" "current" {}

resource "azuread_application" "this" {
  count = var.create_service_principal ? 1 : 0

  display_name = var.name
  owners       = [data.azuread_client_config.current.object_id]
}

resource "azuread_service_principal" "this" {
  count = var.create_service_principal ? 1 : 0

  client_id = azuread_application.this[0].client_id
  owners    = [data.azuread_client_config.current.object_id]
}

resource "azuread_service_principal_password" "this" {
  count = var.create_service_principal ? 1 : 0

  service_principal_id = azuread_service_principal.this[0].id
  end_date             = timeadd(plantimestamp(), "${var.client_secret_expiry_hours}h")

  lifecycle {
    ignore_changes = [end_date]
  }
}
