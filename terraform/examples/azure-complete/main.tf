# azure-complete: resource groups, the least-privilege provisioning identity and the broker, wired together.

data "azurerm_client_config" "current" {}

resource "azurerm_resource_group" "broker" {
  name     = "${var.name}-broker"
  location = var.location
}

# The broker launches its VMs here, and only here.
resource "azurerm_resource_group" "workloads" {
  name     = "${var.name}-workloads"
  location = var.location
}

module "provisioner" {
  source = "../../modules/provider-identity-azure"

  name                         = "${var.name}-provisioner"
  location                     = var.location
  identity_resource_group_name = azurerm_resource_group.broker.name
  subscription_id              = data.azurerm_client_config.current.subscription_id
  workload_resource_group_id   = azurerm_resource_group.workloads.id
}

module "broker" {
  source = "../../modules/broker-azure"

  name                        = var.name
  location                    = var.location
  resource_group_name         = azurerm_resource_group.broker.name
  image                       = var.image
  api_replicas                = var.api_replicas
  allowed_api_cidrs           = var.allowed_api_cidrs
  device_cidrs                = var.device_cidrs
  deployer_cidrs              = var.deployer_cidrs
  mqtt_admin_ssh_public_key   = var.mqtt_admin_ssh_public_key
  provider_identity_id        = module.provisioner.identity_id
  provider_identity_client_id = module.provisioner.client_id
  broker_providers            = var.broker_providers
  extra_environment = {
    AZURE_SUBSCRIPTION_ID = data.azurerm_client_config.current.subscription_id
    AZURE_TENANT_ID       = module.provisioner.tenant_id
  }
}
