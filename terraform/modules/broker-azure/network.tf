# One virtual network, three subnets; NSGs open only 443 (API) to allowed_api_cidrs and 8883 (MQTT) to
# device_cidrs and the API subnet.

resource "azurerm_virtual_network" "broker" {
  name                = "${var.name}-vnet"
  location            = var.location
  resource_group_name = var.resource_group_name
  address_space       = [var.address_space]
  tags                = local.tags
}

resource "azurerm_subnet" "apps" {
  name                 = "apps"
  resource_group_name  = var.resource_group_name
  virtual_network_name = azurerm_virtual_network.broker.name
  address_prefixes     = [cidrsubnet(var.address_space, 7, 0)]
  service_endpoints    = ["Microsoft.KeyVault"]

  delegation {
    name = "container-apps"

    service_delegation {
      name    = "Microsoft.App/environments"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_subnet" "db" {
  name                 = "db"
  resource_group_name  = var.resource_group_name
  virtual_network_name = azurerm_virtual_network.broker.name
  address_prefixes     = [cidrsubnet(var.address_space, 8, 2)]

  delegation {
    name = "postgresql"

    service_delegation {
      name    = "Microsoft.DBforPostgreSQL/flexibleServers"
      actions = ["Microsoft.Network/virtualNetworks/subnets/join/action"]
    }
  }
}

resource "azurerm_subnet" "mqtt" {
  name                 = "mqtt"
  resource_group_name  = var.resource_group_name
  virtual_network_name = azurerm_virtual_network.broker.name
  address_prefixes     = [cidrsubnet(var.address_space, 8, 3)]
  service_endpoints    = ["Microsoft.KeyVault"]
}

resource "azurerm_network_security_group" "apps" {
  name                = "${var.name}-apps"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags

  security_rule {
    name                       = "https-from-allowed"
    description                = "HTTPS to the broker API from allowed_api_cidrs"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "443"
    source_address_prefixes    = var.allowed_api_cidrs
    destination_address_prefix = "*"
  }
}

resource "azurerm_network_security_group" "mqtt" {
  name                = "${var.name}-mqtt"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags

  security_rule {
    name                       = "mqtts-from-devices"
    description                = "MQTT over mutual TLS from edge devices and the broker gateway"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "8883"
    source_address_prefixes    = concat(var.device_cidrs, azurerm_subnet.apps.address_prefixes)
    destination_address_prefix = "*"
  }

  security_rule {
    name                       = "deny-other-inbound"
    description                = "Nothing else reaches the MQTT host from the internet"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "Internet"
    destination_address_prefix = "*"
  }
}

resource "azurerm_network_security_group" "db" {
  name                = "${var.name}-db"
  location            = var.location
  resource_group_name = var.resource_group_name
  tags                = local.tags

  security_rule {
    name                       = "postgres-from-apps"
    description                = "PostgreSQL from the API replicas"
    priority                   = 100
    direction                  = "Inbound"
    access                     = "Allow"
    protocol                   = "Tcp"
    source_port_range          = "*"
    destination_port_range     = "5432"
    source_address_prefixes    = azurerm_subnet.apps.address_prefixes
    destination_address_prefix = "*"
  }

  security_rule {
    name                       = "deny-other-vnet-inbound"
    description                = "Nothing else in the network reaches PostgreSQL"
    priority                   = 4000
    direction                  = "Inbound"
    access                     = "Deny"
    protocol                   = "*"
    source_port_range          = "*"
    destination_port_range     = "*"
    source_address_prefix      = "VirtualNetwork"
    destination_address_prefix = "*"
  }
}

resource "azurerm_subnet_network_security_group_association" "db" {
  subnet_id                 = azurerm_subnet.db.id
  network_security_group_id = azurerm_network_security_group.db.id
}

resource "azurerm_subnet_network_security_group_association" "apps" {
  subnet_id                 = azurerm_subnet.apps.id
  network_security_group_id = azurerm_network_security_group.apps.id
}

resource "azurerm_subnet_network_security_group_association" "mqtt" {
  subnet_id                 = azurerm_subnet.mqtt.id
  network_security_group_id = azurerm_network_security_group.mqtt.id
}
