# The API replicas: `broker serve` on ECS Fargate, api_replicas tasks behind the load balancer.
#
# An init container copies the PEM secrets into an in-task volume, because BROKER_CA_KEY_FILE and the
# BROKER_MQTT_*_FILE keys name files; the database URL and admin token arrive as environment secrets.

resource "aws_ecs_cluster" "broker" {
  name = var.name
  tags = local.tags

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

# The execution role: pulls the image, writes logs, reads exactly this installation's secrets.
resource "aws_iam_role" "execution" {
  name               = "${var.name}-ecs-execution"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

resource "aws_iam_role_policy_attachment" "execution" {
  role       = aws_iam_role.execution.name
  policy_arn = "arn:${data.aws_partition.current.partition}:iam::aws:policy/service-role/AmazonECSTaskExecutionRolePolicy"
}

data "aws_iam_policy_document" "execution_secrets" {
  statement {
    sid       = "ReadBrokerSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = concat(values(local.broker_secrets), values(local.secret_files), values(var.extra_secret_arns))
  }

  statement {
    sid       = "DecryptBrokerSecrets"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.broker.arn]
  }
}

resource "aws_iam_role_policy" "execution_secrets" {
  name   = "read-broker-secrets"
  role   = aws_iam_role.execution.id
  policy = data.aws_iam_policy_document.execution_secrets.json
}

# Without a provisioning identity, the tasks get a role with no permissions: AWS runs in dry-run mode.
resource "aws_iam_role" "task" {
  count = var.provider_task_role_arn == null ? 1 : 0

  name               = "${var.name}-task"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
  tags               = local.tags
}

locals {
  task_role_arn = coalesce(var.provider_task_role_arn, one(aws_iam_role.task[*].arn))

  init_script = join(" && ", concat(
    ["umask 077", "mkdir -p ${local.secrets_dir}"],
    [for file, _ in local.secret_files : "printf '%s' \"$HB_FILE_${upper(replace(replace(file, ".", "_"), "-", "_"))}\" > ${local.secrets_dir}/${file}"],
    ["chown -R ${var.container_uid} ${local.secrets_dir} ${local.data_dir}", "chmod 0400 ${local.secrets_dir}/*"],
  ))

  container_definitions = [
    {
      name                   = "write-secret-files"
      image                  = var.init_image
      essential              = false
      readonlyRootFilesystem = true
      command                = ["sh", "-c", local.init_script]
      secrets = [for file, arn in local.secret_files : {
        name      = "HB_FILE_${upper(replace(replace(file, ".", "_"), "-", "_"))}"
        valueFrom = arn
      }]
      mountPoints = [
        { sourceVolume = "secrets", containerPath = local.secrets_dir, readOnly = false },
        { sourceVolume = "data", containerPath = local.data_dir, readOnly = false },
      ]
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.api.name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = "init"
        }
      }
    },
    {
      name                   = "broker"
      image                  = var.image
      essential              = true
      user                   = tostring(var.container_uid)
      readonlyRootFilesystem = true
      command                = ["broker", "serve"]
      portMappings           = [{ containerPort = var.broker_port, protocol = "tcp" }]
      environment            = [for key in sort(keys(local.broker_environment)) : { name = key, value = local.broker_environment[key] }]
      secrets = concat(
        [for key, arn in local.broker_secrets : { name = key, valueFrom = arn }],
        [for key, arn in var.extra_secret_arns : { name = key, valueFrom = arn }],
      )
      dependsOn = [{ containerName = "write-secret-files", condition = "SUCCESS" }]
      mountPoints = [
        { sourceVolume = "secrets", containerPath = local.secrets_dir, readOnly = true },
        { sourceVolume = "data", containerPath = local.data_dir, readOnly = false },
        { sourceVolume = "tmp", containerPath = "/tmp", readOnly = false },
      ]
      healthCheck = {
        command     = ["CMD", "python", "-c", "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:${var.broker_port}/healthz', timeout=3)"]
        interval    = 30
        timeout     = 5
        retries     = 3
        startPeriod = 30
      }
      logConfiguration = {
        logDriver = "awslogs"
        options = {
          awslogs-group         = aws_cloudwatch_log_group.api.name
          awslogs-region        = data.aws_region.current.name
          awslogs-stream-prefix = "broker"
        }
      }
    },
  ]
}

resource "aws_ecs_task_definition" "broker" {
  family                   = var.name
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.task_cpu
  memory                   = var.task_memory_mib
  execution_role_arn       = aws_iam_role.execution.arn
  task_role_arn            = local.task_role_arn
  container_definitions    = jsonencode(local.container_definitions)
  tags                     = local.tags

  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }

  volume {
    name = "secrets"
  }

  volume {
    name = "data"
  }

  volume {
    name = "tmp"
  }
}

resource "aws_ecs_service" "broker" {
  name                               = var.name
  cluster                            = aws_ecs_cluster.broker.id
  task_definition                    = aws_ecs_task_definition.broker.arn
  desired_count                      = var.api_replicas
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  deployment_minimum_healthy_percent = 50
  deployment_maximum_percent         = 200
  health_check_grace_period_seconds  = 60
  propagate_tags                     = "SERVICE"
  tags                               = local.tags

  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [aws_security_group.tasks.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.api.arn
    container_name   = "broker"
    container_port   = var.broker_port
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_lb_listener.https, aws_secretsmanager_secret_version.this]
}
