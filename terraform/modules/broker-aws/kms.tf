# One customer-managed key encrypts the secrets, the database, its Performance Insights data, the logs and the
# MQTT host's disk.

data "aws_iam_policy_document" "kms" {
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource means this key only; the account root administers it.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource means this key only.
  #checkov:skip=CKV_AWS_109:The account root must manage its own key policy (AWS default key policy).
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]

    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }

  statement {
    sid       = "CloudWatchLogsEncrypt"
    actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
    resources = ["*"]

    principals {
      type        = "Service"
      identifiers = ["logs.${data.aws_region.current.name}.amazonaws.com"]
    }

    condition {
      test     = "ArnLike"
      variable = "kms:EncryptionContext:aws:logs:arn"
      values   = ["arn:${data.aws_partition.current.partition}:logs:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:log-group:/hybrid-broker/${var.name}/*"]
    }
  }
}

resource "aws_kms_key" "broker" {
  description             = "${var.name}: secrets, database, logs and disks of hybrid-broker"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
  tags                    = local.tags
}

resource "aws_kms_alias" "broker" {
  name          = "alias/${var.name}"
  target_key_id = aws_kms_key.broker.key_id
}
