# provider-identity-aws: the IAM role hybrid-broker's AWS adapter (providers/aws.py) provisions with.
#
# The actions below are exactly the calls providers/ makes (README.md lists each one with its code path;
# tests/terraform derives the list from the code and fails when the two differ). Mutating calls are scoped by
# tag: an instance can only be launched carrying var.scope_tag_key, and only instances carrying it can be
# re-tagged or terminated. Describe calls cannot be scoped to resources by EC2 and use "*".

data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}

locals {
  ec2_arn = "arn:${data.aws_partition.current.partition}:ec2:*:${data.aws_caller_identity.current.account_id}"
  region_condition = length(var.allowed_regions) == 0 ? [] : [{
    test     = "StringEquals"
    variable = "aws:RequestedRegion"
    values   = var.allowed_regions
  }]
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = var.trusted_services
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }

  dynamic "statement" {
    for_each = length(var.trusted_role_arns) == 0 ? [] : [1]

    content {
      actions = ["sts:AssumeRole"]

      principals {
        type        = "AWS"
        identifiers = var.trusted_role_arns
      }
    }
  }
}

data "aws_iam_policy_document" "provisioning" {
  statement {
    sid = "ReadCatalogAndState"
    actions = [
      "ec2:DescribeAddresses",
      "ec2:DescribeAvailabilityZones",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypeOfferings",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeInstances",
      "ec2:DescribeNetworkInterfaces",
      "ec2:DescribeSpotPriceHistory",
      "ec2:DescribeVolumes",
    ]
    resources = ["*"]

    dynamic "condition" {
      for_each = local.region_condition

      content {
        test     = condition.value.test
        variable = condition.value.variable
        values   = condition.value.values
      }
    }
  }

  statement {
    sid       = "LaunchOnlyTaggedInstances"
    actions   = ["ec2:RunInstances"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "Null"
      variable = "aws:RequestTag/${var.scope_tag_key}"
      values   = ["false"]
    }

    dynamic "condition" {
      for_each = local.region_condition

      content {
        test     = condition.value.test
        variable = condition.value.variable
        values   = condition.value.values
      }
    }
  }

  statement {
    sid     = "LaunchWithTheseResources"
    actions = ["ec2:RunInstances"]
    resources = concat(
      [
        "${local.ec2_arn}:volume/*",
        "${local.ec2_arn}:network-interface/*",
        "${local.ec2_arn}:security-group/*",
        "${local.ec2_arn}:key-pair/*",
        "arn:${data.aws_partition.current.partition}:ec2:*::image/*",
      ],
      length(var.subnet_arns) == 0 ? ["${local.ec2_arn}:subnet/*"] : var.subnet_arns,
    )

    dynamic "condition" {
      for_each = local.region_condition

      content {
        test     = condition.value.test
        variable = condition.value.variable
        values   = condition.value.values
      }
    }
  }

  statement {
    sid       = "TagAtLaunch"
    actions   = ["ec2:CreateTags"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  # A job's VM prints HB-EXIT-CODE=<n> on its serial console before powering off; the adapter reads it.
  statement {
    sid       = "ReadConsoleOfBrokerInstances"
    actions   = ["ec2:GetConsoleOutput"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "Null"
      variable = "aws:ResourceTag/${var.scope_tag_key}"
      values   = ["false"]
    }
  }

  # The orphan sweeper (providers/sweeper.py) deletes unattached volumes and ENIs and releases Elastic IPs that
  # carry the broker's tag; nothing untagged can be touched.
  statement {
    sid       = "SweepOnlyBrokerLeftovers"
    actions   = ["ec2:DeleteNetworkInterface", "ec2:DeleteVolume", "ec2:ReleaseAddress"]
    resources = ["${local.ec2_arn}:volume/*", "${local.ec2_arn}:network-interface/*", "${local.ec2_arn}:elastic-ip/*"]

    condition {
      test     = "Null"
      variable = "aws:ResourceTag/${var.scope_tag_key}"
      values   = ["false"]
    }
  }

  statement {
    sid       = "TerminateOnlyBrokerInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:instance/*"]

    condition {
      test     = "Null"
      variable = "aws:ResourceTag/${var.scope_tag_key}"
      values   = ["false"]
    }
  }
}

resource "aws_iam_policy" "provisioning" {
  name        = var.name
  description = "hybrid-broker: launch, describe, tag, read the console of and terminate its own EC2 instances; read instance types and prices"
  policy      = data.aws_iam_policy_document.provisioning.json
  tags        = var.tags
}

resource "aws_iam_role" "this" {
  name                 = var.name
  assume_role_policy   = data.aws_iam_policy_document.assume.json
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags
}

resource "aws_iam_role_policy_attachment" "provisioning" {
  role       = aws_iam_role.this.name
  policy_arn = aws_iam_policy.provisioning.arn
}
