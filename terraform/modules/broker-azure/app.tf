# The API replicas: `broker serve` on Azure Container Apps, ingress HTTPS-only with an IP allow-list.

resource "azurerm_container_app_environment" "broker" {
  name                       = "${var.name}-env"
  location                   = var.location
  resource_group_name        = var.resource_group_name
  log_analytics_workspace_id = azurerm_log_analytics_workspace.broker.id
  infrastructure_subnet_id   = azurerm_subnet.apps.id
  tags                       = local.tags

  workload_profile {
    name                  = "Consumption"
    workload_profile_type = "Consumption"
  }
}

resource "azurerm_container_app" "broker" {
  name                         = "${var.name}-api"
  container_app_environment_id = azurerm_container_app_environment.broker.id
  resource_group_name          = var.resource_group_name
  revision_mode                = "Single"
  workload_profile_name        = "Consumption"
  tags                         = local.tags

  identity {
    type         = "UserAssigned"
    identity_ids = compact([azurerm_user_assigned_identity.app.id, var.provider_identity_id])
  }

  dynamic "secret" {
    for_each = toset(concat(values(local.broker_secrets), local.secret_files))

    content {
      name                = secret.value
      key_vault_secret_id = azurerm_key_vault_secret.this[secret.value].versionless_id
      identity            = azurerm_user_assigned_identity.app.id
    }
  }

  ingress {
    external_enabled           = true
    target_port                = var.broker_port
    transport                  = "http"
    allow_insecure_connections = false

    dynamic "ip_security_restriction" {
      for_each = var.allowed_api_cidrs

      content {
        name             = "allowed-${ip_security_restriction.key}"
        action           = "Allow"
        ip_address_range = ip_security_restriction.value
      }
    }

    traffic_weight {
      latest_revision = true
      percentage      = 100
    }
  }

  template {
    min_replicas = var.api_replicas
    max_replicas = var.api_replicas

    volume {
      name         = "secrets"
      storage_type = "Secret"
    }

    volume {
      name         = "data"
      storage_type = "EmptyDir"
    }

    container {
      name    = "broker"
      image   = var.image
      cpu     = var.replica_cpu
      memory  = var.replica_memory
      command = ["broker", "serve"]

      dynamic "env" {
        for_each = local.broker_environment

        content {
          name  = env.key
          value = env.value
        }
      }

      dynamic "env" {
        for_each = local.broker_secrets

        content {
          name        = env.key
          secret_name = env.value
        }
      }

      volume_mounts {
        name = "secrets"
        path = local.secrets_dir
      }

      volume_mounts {
        name = "data"
        path = local.data_dir
      }

      readiness_probe {
        transport = "HTTP"
        port      = var.broker_port
        path      = "/readyz"
      }

      liveness_probe {
        transport = "HTTP"
        port      = var.broker_port
        path      = "/healthz"
      }
    }
  }

  depends_on = [azurerm_role_assignment.app_secrets]
}
