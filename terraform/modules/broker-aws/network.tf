# Security groups: only 443 from allowed_api_cidrs and 8883 from device_cidrs are open from outside; every
# other rule names the security group on its other end.

resource "aws_security_group" "alb" {
  name        = "${var.name}-alb"
  description = "hybrid-broker API load balancer: HTTPS from allowed_api_cidrs"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group_rule" "alb_in_https" {
  type              = "ingress"
  description       = "HTTPS to the broker API from allowed_api_cidrs"
  security_group_id = aws_security_group.alb.id
  protocol          = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_blocks       = var.allowed_api_cidrs
}

resource "aws_security_group_rule" "alb_out_tasks" {
  type                     = "egress"
  description              = "Load balancer to the API tasks"
  security_group_id        = aws_security_group.alb.id
  protocol                 = "tcp"
  from_port                = var.broker_port
  to_port                  = var.broker_port
  source_security_group_id = aws_security_group.tasks.id
}

resource "aws_security_group" "tasks" {
  name        = "${var.name}-tasks"
  description = "hybrid-broker API tasks: from the load balancer only"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group_rule" "tasks_in_alb" {
  type                     = "ingress"
  description              = "API traffic from the load balancer"
  security_group_id        = aws_security_group.tasks.id
  protocol                 = "tcp"
  from_port                = var.broker_port
  to_port                  = var.broker_port
  source_security_group_id = aws_security_group.alb.id
}

resource "aws_security_group_rule" "tasks_out_https" {
  type              = "egress"
  description       = "Cloud provider APIs, price lists, Secrets Manager and the image registry over HTTPS"
  security_group_id = aws_security_group.tasks.id
  protocol          = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_blocks       = ["0.0.0.0/0"]
}

resource "aws_security_group_rule" "tasks_out_db" {
  type                     = "egress"
  description              = "PostgreSQL"
  security_group_id        = aws_security_group.tasks.id
  protocol                 = "tcp"
  from_port                = 5432
  to_port                  = 5432
  source_security_group_id = aws_security_group.db.id
}

resource "aws_security_group_rule" "tasks_out_mqtt" {
  type                     = "egress"
  description              = "The broker gateway to Mosquitto (mutual TLS)"
  security_group_id        = aws_security_group.tasks.id
  protocol                 = "tcp"
  from_port                = 8883
  to_port                  = 8883
  source_security_group_id = aws_security_group.mqtt.id
}

resource "aws_security_group" "db" {
  name        = "${var.name}-db"
  description = "hybrid-broker PostgreSQL: from the API tasks only"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group_rule" "db_in_tasks" {
  type                     = "ingress"
  description              = "PostgreSQL from the API tasks"
  security_group_id        = aws_security_group.db.id
  protocol                 = "tcp"
  from_port                = 5432
  to_port                  = 5432
  source_security_group_id = aws_security_group.tasks.id
}

resource "aws_security_group" "mqtt" {
  name        = "${var.name}-mqtt"
  description = "hybrid-broker Mosquitto: MQTT over mutual TLS from devices and the gateway"
  vpc_id      = var.vpc_id
  tags        = local.tags
}

resource "aws_security_group_rule" "mqtt_in_devices" {
  type              = "ingress"
  description       = "MQTT over mutual TLS from edge devices"
  security_group_id = aws_security_group.mqtt.id
  protocol          = "tcp"
  from_port         = 8883
  to_port           = 8883
  cidr_blocks       = var.device_cidrs
}

resource "aws_security_group_rule" "mqtt_in_tasks" {
  type                     = "ingress"
  description              = "MQTT over mutual TLS from the broker gateway"
  security_group_id        = aws_security_group.mqtt.id
  protocol                 = "tcp"
  from_port                = 8883
  to_port                  = 8883
  source_security_group_id = aws_security_group.tasks.id
}

resource "aws_security_group_rule" "mqtt_out_https" {
  type              = "egress"
  description       = "Secrets Manager, CloudWatch, the image registry, packages and the broker's CRL over HTTPS"
  security_group_id = aws_security_group.mqtt.id
  protocol          = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_blocks       = ["0.0.0.0/0"]
}
