# The API's load balancer: HTTPS only (no port 80 listener), TLS 1.2+.

resource "aws_lb" "api" {
  #checkov:skip=CKV2_AWS_76:The WAF web ACL is the operator's (var.waf_web_acl_arn); its rule sets, Log4j AMR included, are configured there.
  name                       = substr("${var.name}-api", 0, 32)
  load_balancer_type         = "application"
  internal                   = false
  subnets                    = var.public_subnet_ids
  security_groups            = [aws_security_group.alb.id]
  drop_invalid_header_fields = true
  enable_deletion_protection = var.load_balancer_deletion_protection
  tags                       = local.tags

  access_logs {
    enabled = var.alb_access_logs_bucket != null
    bucket  = coalesce(var.alb_access_logs_bucket, "unused")
    prefix  = var.name
  }
}

resource "aws_wafv2_web_acl_association" "api" {
  count = var.waf_web_acl_arn == null ? 0 : 1

  resource_arn = aws_lb.api.arn
  web_acl_arn  = var.waf_web_acl_arn
}

resource "aws_lb_target_group" "api" {
  name                 = substr("${var.name}-api", 0, 32)
  port                 = var.broker_port
  protocol             = "HTTP"
  target_type          = "ip"
  vpc_id               = var.vpc_id
  deregistration_delay = 30
  tags                 = local.tags

  health_check {
    path                = "/readyz"
    matcher             = "200"
    interval            = 15
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.api.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  certificate_arn   = var.certificate_arn
  tags              = local.tags

  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.api.arn
  }
}
