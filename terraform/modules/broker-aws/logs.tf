resource "aws_cloudwatch_log_group" "api" {
  name              = "/hybrid-broker/${var.name}/api"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.broker.arn
  tags              = local.tags
}

resource "aws_cloudwatch_log_group" "mqtt" {
  name              = "/hybrid-broker/${var.name}/mqtt"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.broker.arn
  tags              = local.tags
}
