# PostgreSQL Flexible Server: private (delegated subnet, private DNS), backups on, optional zone-redundant HA.

resource "azurerm_private_dns_zone" "db" {
  name                = "${var.name}.postgres.database.azure.com"
  resource_group_name = var.resource_group_name
  tags                = local.tags
}

resource "azurerm_private_dns_zone_virtual_network_link" "db" {
  name                  = "${var.name}-db"
  private_dns_zone_name = azurerm_private_dns_zone.db.name
  resource_group_name   = var.resource_group_name
  virtual_network_id    = azurerm_virtual_network.broker.id
  tags                  = local.tags
}

resource "azurerm_postgresql_flexible_server" "broker" {
  #checkov:skip=CKV2_AZURE_57:VNet-injected into a delegated subnet with public access off: private by construction; Azure offers private endpoints only for the other (public access) networking mode.
  name                          = "${var.name}-pg"
  location                      = var.location
  resource_group_name           = var.resource_group_name
  version                       = var.db_version
  sku_name                      = var.db_sku_name
  storage_mb                    = var.db_storage_mb
  administrator_login           = "broker"
  administrator_password        = random_password.db.result
  delegated_subnet_id           = azurerm_subnet.db.id
  private_dns_zone_id           = azurerm_private_dns_zone.db.id
  public_network_access_enabled = false
  backup_retention_days         = var.db_backup_retention_days
  geo_redundant_backup_enabled  = var.db_geo_redundant_backup
  zone                          = "1"
  tags                          = local.tags

  dynamic "high_availability" {
    for_each = var.db_high_availability ? [1] : []

    content {
      mode                      = "ZoneRedundant"
      standby_availability_zone = "2"
    }
  }

  depends_on = [azurerm_private_dns_zone_virtual_network_link.db]
}

resource "azurerm_postgresql_flexible_server_database" "broker" {
  name      = "broker"
  server_id = azurerm_postgresql_flexible_server.broker.id
  charset   = "UTF8"
  collation = "en_US.utf8"
}

resource "azurerm_postgresql_flexible_server_configuration" "require_tls" {
  name      = "require_secure_transport"
  server_id = azurerm_postgresql_flexible_server.broker.id
  value     = "on"
}

resource "azurerm_postgresql_flexible_server_configuration" "log_checkpoints" {
  name      = "log_checkpoints"
  server_id = azurerm_postgresql_flexible_server.broker.id
  value     = "on"
}

resource "azurerm_postgresql_flexible_server_configuration" "log_connections" {
  name      = "log_connections"
  server_id = azurerm_postgresql_flexible_server.broker.id
  value     = "on"
}
