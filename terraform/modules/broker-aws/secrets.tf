# The broker CA, the MQTT server certificate, the gateway's client certificate, the admin token and the
# database URL, all in Secrets Manager.
#
# Design choice: the CA is created here so that one `terraform apply` yields a working installation. Its key
# is then also in the Terraform state: keep the state in an encrypted, access-controlled backend (docs/DEPLOY.md),
# or create the CA offline with `broker ca init` and overwrite the ca-key/ca-cert secret values.

resource "tls_private_key" "ca" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_self_signed_cert" "ca" {
  private_key_pem       = tls_private_key.ca.private_key_pem
  is_ca_certificate     = true
  validity_period_hours = 87600
  allowed_uses          = ["cert_signing", "crl_signing", "digital_signature"]

  subject {
    common_name  = "${var.name} hybrid-broker CA"
    organization = "hybrid-broker"
  }
}

resource "tls_private_key" "mqtt_server" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "mqtt_server" {
  private_key_pem = tls_private_key.mqtt_server.private_key_pem
  dns_names       = compact([aws_eip.mqtt.public_dns, aws_network_interface.mqtt.private_dns_name, var.mqtt_domain_name])
  ip_addresses    = [aws_eip.mqtt.public_ip, aws_network_interface.mqtt.private_ip]

  subject {
    common_name  = local.mqtt_public_host
    organization = "hybrid-broker"
  }
}

resource "tls_locally_signed_cert" "mqtt_server" {
  cert_request_pem      = tls_cert_request.mqtt_server.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 8760
  early_renewal_hours   = 720
  allowed_uses          = ["digital_signature", "key_encipherment", "server_auth"]
}

resource "tls_private_key" "gateway" {
  algorithm   = "ECDSA"
  ecdsa_curve = "P256"
}

resource "tls_cert_request" "gateway" {
  private_key_pem = tls_private_key.gateway.private_key_pem

  subject {
    common_name  = var.gateway_common_name
    organization = "hybrid-broker"
  }
}

resource "tls_locally_signed_cert" "gateway" {
  cert_request_pem      = tls_cert_request.gateway.cert_request_pem
  ca_private_key_pem    = tls_private_key.ca.private_key_pem
  ca_cert_pem           = tls_self_signed_cert.ca.cert_pem
  validity_period_hours = 8760
  early_renewal_hours   = 720
  allowed_uses          = ["digital_signature", "client_auth"]
}

resource "random_password" "db" {
  length  = 40
  special = false
}

resource "random_password" "admin_token" {
  length  = 48
  special = false
}

locals {
  # name => value of each secret; every one is encrypted with the module's KMS key.
  secret_values = {
    "admin-token"  = random_password.admin_token.result
    "database-url" = "postgresql+psycopg://${aws_db_instance.broker.username}:${random_password.db.result}@${aws_db_instance.broker.address}:${aws_db_instance.broker.port}/${aws_db_instance.broker.db_name}?sslmode=require"
    "ca-cert"      = tls_self_signed_cert.ca.cert_pem
    "ca-key"       = tls_private_key.ca.private_key_pem
    "mqtt-cert"    = "${tls_locally_signed_cert.mqtt_server.cert_pem}${tls_self_signed_cert.ca.cert_pem}"
    "mqtt-key"     = tls_private_key.mqtt_server.private_key_pem
    "gateway-cert" = "${tls_locally_signed_cert.gateway.cert_pem}${tls_self_signed_cert.ca.cert_pem}"
    "gateway-key"  = tls_private_key.gateway.private_key_pem
  }
}

# No secret has a rotation Lambda: each one says, next to the resource, how it is rotated instead.
resource "aws_secretsmanager_secret" "admin_token" {
  #checkov:skip=CKV2_AWS_57:Rotated by terraform apply -replace (docs/DEPLOY.md); no rotation Lambda.
  name                    = "${var.name}/admin-token"
  description             = "BROKER_ADMIN_TOKEN of hybrid-broker ${var.name}"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "database_url" {
  #checkov:skip=CKV2_AWS_57:Rotated by terraform apply -replace (docs/DEPLOY.md); no rotation Lambda.
  name                    = "${var.name}/database-url"
  description             = "BROKER_DATABASE_URL of hybrid-broker ${var.name} (contains the database password)"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "ca_cert" {
  #checkov:skip=CKV2_AWS_57:A CA certificate is public material; it is replaced, not rotated.
  name                    = "${var.name}/ca-cert"
  description             = "CA bundle of hybrid-broker ${var.name}: verifies the MQTT server and device certificates"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "ca_key" {
  #checkov:skip=CKV2_AWS_57:Rotating a CA key re-enrolls every device; done deliberately (docs/DEPLOY.md).
  name                    = "${var.name}/ca-key"
  description             = "BROKER_CA_KEY_FILE content: the CA key that signs device certificates"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "mqtt_cert" {
  #checkov:skip=CKV2_AWS_57:Certificate renewed by terraform (early_renewal_hours), not by a rotation Lambda.
  name                    = "${var.name}/mqtt-cert"
  description             = "Mosquitto server certificate chain of hybrid-broker ${var.name}"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "mqtt_key" {
  #checkov:skip=CKV2_AWS_57:Key renewed with its certificate by terraform, not by a rotation Lambda.
  name                    = "${var.name}/mqtt-key"
  description             = "Mosquitto server key of hybrid-broker ${var.name}"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "gateway_cert" {
  #checkov:skip=CKV2_AWS_57:Certificate renewed by terraform (early_renewal_hours), not by a rotation Lambda.
  name                    = "${var.name}/gateway-cert"
  description             = "BROKER_MQTT_CERT_FILE content: the gateway's MQTT client certificate chain"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

resource "aws_secretsmanager_secret" "gateway_key" {
  #checkov:skip=CKV2_AWS_57:Key renewed with its certificate by terraform, not by a rotation Lambda.
  name                    = "${var.name}/gateway-key"
  description             = "BROKER_MQTT_KEY_FILE content: the gateway's MQTT client key"
  kms_key_id              = aws_kms_key.broker.arn
  recovery_window_in_days = 7
  tags                    = local.tags
}

locals {
  secret_arns = {
    "admin-token"  = aws_secretsmanager_secret.admin_token.arn
    "database-url" = aws_secretsmanager_secret.database_url.arn
    "ca-cert"      = aws_secretsmanager_secret.ca_cert.arn
    "ca-key"       = aws_secretsmanager_secret.ca_key.arn
    "mqtt-cert"    = aws_secretsmanager_secret.mqtt_cert.arn
    "mqtt-key"     = aws_secretsmanager_secret.mqtt_key.arn
    "gateway-cert" = aws_secretsmanager_secret.gateway_cert.arn
    "gateway-key"  = aws_secretsmanager_secret.gateway_key.arn
  }
}

resource "aws_secretsmanager_secret_version" "this" {
  for_each = local.secret_arns

  secret_id     = each.value
  secret_string = local.secret_values[each.key]
}
