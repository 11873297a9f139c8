# provider-identity-gcp: the service account hybrid-broker's GCP adapter (providers/gcp.py, libcloud GCE)
# provisions with.
#
# The custom role holds exactly the permissions of the Compute Engine calls providers/ makes through libcloud
# (README.md lists each one with its code path; tests/terraform derives them from the code). GCP cannot condition
# compute permissions on labels, so the lifecycle binding is conditioned on the instance name prefix and the
# project is the scope; list/read permissions are evaluated on the project and stay unconditioned.

locals {
  read_permissions = [
    "compute.acceleratorTypes.list",
    "compute.disks.list",
    "compute.instances.list",
    "compute.machineTypes.list",
    "compute.zones.get",
    "compute.zones.list",
  ]

  # A job's VM reports its exit code and log tail on serial port 1 (getSerialPortOutput); the orphan sweeper
  # deletes unattached boot disks of the broker's instances (disks.delete).
  lifecycle_permissions = [
    "compute.disks.create",
    "compute.disks.delete",
    "compute.disks.setLabels",
    "compute.images.useReadOnly",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.getSerialPortOutput",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.networks.use",
    "compute.networks.useExternalIp",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.zoneOperations.get",
  ]

  # Instances and disks (a boot disk is named like its instance) only with the broker's name prefix.
  name_condition = "(resource.type != 'compute.googleapis.com/Instance' || resource.name.extract('/instances/{name}').startsWith('${var.instance_name_prefix}')) && (resource.type != 'compute.googleapis.com/Disk' || resource.name.extract('/disks/{name}').startsWith('${var.instance_name_prefix}'))"
}

resource "google_service_account" "this" {
  project      = var.project_id
  account_id   = var.account_id
  display_name = "hybrid-broker provisioner"
  description  = "Launches, lists and deletes hybrid-broker's Compute Engine instances"
}

resource "google_project_iam_custom_role" "read" {
  project     = var.project_id
  role_id     = "${var.role_id}Read"
  title       = "hybrid-broker catalog and state reads"
  description = "List zones, regions, machine types, images and instances for placement"
  permissions = local.read_permissions
}

resource "google_project_iam_custom_role" "lifecycle" {
  project     = var.project_id
  role_id     = "${var.role_id}Lifecycle"
  title       = "hybrid-broker instance lifecycle"
  description = "Create, label, read and delete hybrid-broker instances"
  permissions = local.lifecycle_permissions
}

resource "google_project_iam_member" "read" {
  project = var.project_id
  role    = google_project_iam_custom_role.read.id
  member  = "serviceAccount:${google_service_account.this.email}"
}

resource "google_project_iam_member" "lifecycle" {
  project = var.project_id
  role    = google_project_iam_custom_role.lifecycle.id
  member  = "serviceAccount:${google_service_account.this.email}"

  dynamic "condition" {
    for_each = var.instance_name_prefix == "" ? [] : [1]

    content {
      title       = "hybrid-broker instances only"
      description = "Instances whose name starts with ${var.instance_name_prefix}"
      expression  = local.name_condition
    }
  }
}

# Workload identity federation: the principals of an external identity pool (a broker running on AWS or
# Azure, or in Kubernetes) may impersonate the service account, so no key is ever created. The broker uses
# an `external_account` credential file (GOOGLE_APPLICATION_CREDENTIALS) with that pool's provider and
# `service_account_impersonation_url` naming this account (docs/PROVIDERS.md, credentials).
resource "google_service_account_iam_member" "workload_identity" {
  for_each = toset(var.workload_identity_principals)

  service_account_id = google_service_account.this.name
  role               = "roles/iam.workloadIdentityUser"
  member             = each.value
}
