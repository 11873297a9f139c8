# Mosquitto for the edge fleet on one small EC2 instance: mutual TLS on 8883, its CA and server certificate
# read from Secrets Manager at boot, IMDSv2 only, encrypted disk, no SSH (use SSM Session Manager).
# docs/DEPLOY.md says when to move to a clustered broker (EMQX, HiveMQ).

data "aws_ssm_parameter" "al2023" {
  name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "mqtt" {
  name               = "${var.name}-mqtt"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "mqtt_ssm" {
  role       = aws_iam_role.mqtt.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

data "aws_iam_policy_document" "mqtt" {
  statement {
    sid     = "ReadMqttSecrets"
    actions = ["secretsmanager:GetSecretValue"]
    resources = [
      aws_secretsmanager_secret.ca_cert.arn,
      aws_secretsmanager_secret.mqtt_cert.arn,
      aws_secretsmanager_secret.mqtt_key.arn,
    ]
  }

  statement {
    sid       = "DecryptMqttSecrets"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.broker.arn]
  }

  statement {
    sid       = "WriteMqttLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.mqtt.arn}:*"]
  }
}

resource "aws_iam_role_policy" "mqtt" {
  name   = "read-mqtt-secrets"
  role   = aws_iam_role.mqtt.id
  policy = data.aws_iam_policy_document.mqtt.json
}

resource "aws_iam_instance_profile" "mqtt" {
  name = "${var.name}-mqtt"
  role = aws_iam_role.mqtt.name
  tags = local.tags
}

# A fixed network interface gives the server certificate a private address known before the instance exists.
resource "aws_network_interface" "mqtt" {
  subnet_id       = var.public_subnet_ids[0]
  security_groups = [aws_security_group.mqtt.id]
  description     = "${var.name} Mosquitto"
  tags            = local.tags
}

resource "aws_eip" "mqtt" {
  domain = "vpc"
  tags   = merge(local.tags, { Name = "${var.name}-mqtt" })
}

resource "aws_eip_association" "mqtt" {
  allocation_id = aws_eip.mqtt.id
  instance_id   = aws_instance.mqtt.id
}

resource "aws_instance" "mqtt" {
  ami                         = data.aws_ssm_parameter.al2023.value
  instance_type               = var.mqtt_instance_type
  iam_instance_profile        = aws_iam_instance_profile.mqtt.name
  ebs_optimized               = true
  monitoring                  = true
  user_data_replace_on_change = true
  user_data = templatefile("${path.module}/templates/mosquitto-user-data.sh.tftpl", {
    region              = data.aws_region.current.name
    mqtt_image          = var.mqtt_image
    ca_cert_secret      = aws_secretsmanager_secret.ca_cert.arn
    server_cert_secret  = aws_secretsmanager_secret.mqtt_cert.arn
    server_key_secret   = aws_secretsmanager_secret.mqtt_key.arn
    gateway_common_name = var.gateway_common_name
    log_group           = aws_cloudwatch_log_group.mqtt.name
    crl_url             = "${local.api_url}/v1/edge/crl"
  })
  tags = merge(local.tags, { Name = "${var.name}-mqtt" })

  network_interface {
    network_interface_id = aws_network_interface.mqtt.id
    device_index         = 0
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 2
  }

  root_block_device {
    encrypted   = true
    kms_key_id  = aws_kms_key.broker.arn
    volume_type = "gp3"
    volume_size = 20
  }

  depends_on = [aws_secretsmanager_secret_version.this]
}
