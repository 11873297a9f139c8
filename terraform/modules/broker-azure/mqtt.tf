# Mosquitto for the edge fleet on one small VM: mutual TLS on 8883, certificates read from Key Vault at boot
# with the VM's managed identity, encryption at host, no password login, no SSH port open.

resource "azurerm_public_ip" "mqtt" {
  name                = "${var.name}-mqtt"
  location            = var.location
  resource_group_name = var.resource_group_name
  allocation_method   = "Static"
  sku                 = "Standard"
  domain_name_label   = "${var.name}-mqtt"
  tags                = local.tags
}

resource "azurerm_network_interface" "mqtt" {
  #checkov:skip=CKV_AZURE_119:Edge devices reach Mosquitto over the internet; only 8883 (mutual TLS) from device_cidrs is allowed by the NSG.
  name                = "${var.name}-mqtt"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags

  ip_configuration {
    name                          = "primary"
    subnet_id                     = azurerm_subnet.mqtt.id
    private_ip_address_allocation = "Static"
    private_ip_address            = cidrhost(azurerm_subnet.mqtt.address_prefixes[0], 10)
    public_ip_address_id          = azurerm_public_ip.mqtt.id
  }
}

resource "azurerm_user_assigned_identity" "mqtt" {
  name                = "${var.name}-mqtt"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags
}

resource "azurerm_role_assignment" "mqtt_secrets" {
  for_each = toset(["ca-cert", "mqtt-cert", "mqtt-key"])

  scope                = "${azurerm_key_vault.broker.id}/secrets/${each.value}"
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.mqtt.principal_id
  depends_on           = [azurerm_key_vault_secret.this]
}

resource "azurerm_linux_virtual_machine" "mqtt" {
  name                            = "${var.name}-mqtt"
  location                        = var.location
  resource_group_name             = var.resource_group_name
  size                            = var.mqtt_vm_size
  admin_username                  = "hbadmin"
  disable_password_authentication = true
  encryption_at_host_enabled      = true
  allow_extension_operations      = false
  network_interface_ids           = [azurerm_network_interface.mqtt.id]
  tags                            = local.tags
  custom_data = base64encode(templatefile("${path.module}/templates/mosquitto-cloud-init.sh.tftpl", {
    vault_name          = azurerm_key_vault.broker.name
    client_id           = azurerm_user_assigned_identity.mqtt.client_id
    mqtt_image          = var.mqtt_image
    gateway_common_name = var.gateway_common_name
    crl_url             = "${local.api_url}/v1/edge/crl"
  }))

  admin_ssh_key {
    username   = "hbadmin"
    public_key = var.mqtt_admin_ssh_public_key
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.mqtt.id]
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
  }

  source_image_reference {
    publisher = "Debian"
    offer     = "debian-12"
    sku       = "12-gen2"
    version   = "latest"
  }

  boot_diagnostics {}

  depends_on = [azurerm_role_assignment.mqtt_secrets]
}
