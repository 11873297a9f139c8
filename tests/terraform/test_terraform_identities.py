"""The provisioning identities grant exactly the permissions the provider adapters' code needs.

The permission sets are derived from providers/ by tests/terraform/permscan.py (AST scan + the SDKs' own
sources/models); each identity module must grant exactly that set, and its README must list every permission.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.terraform.permscan import azure_action, gce_permission, scan_providers
from tests.terraform.tfload import REPO, TERRAFORM, blocks, unquote

MODULES = TERRAFORM / "modules"


def _aws_granted() -> set[str]:
    doc = dict(blocks(MODULES / "provider-identity-aws", "data"))["aws_iam_policy_document.provisioning"]
    return {a for st in doc["statement"] for a in st["actions"]}


def _azure_granted() -> dict[str, set[str]]:
    res = dict(blocks(MODULES / "provider-identity-azure", "resource"))
    return {
        name: set(res[f"azurerm_role_definition.{name}"]["permissions"][0]["actions"])
        for name in ("catalog", "lifecycle")
    }


def _gcp_granted() -> set[str]:
    loc = dict(blocks(MODULES / "provider-identity-gcp", "locals"))
    return set(loc["read_permissions"]) | set(loc["lifecycle_permissions"])


def _write(tmp_path: Path, name: str, code: str) -> Path:
    pkg = tmp_path / "providers"
    pkg.mkdir(exist_ok=True)
    (pkg / name).write_text(textwrap.dedent(code))
    return pkg


# --- the scanner itself, on small synthetic adapters ------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (
            "import boto3\nec2 = boto3.client('ec2')\nec2.describe_instance_types()\n",
            {"ec2:DescribeInstanceTypes"},
        ),
        (
            "import boto3\nc = boto3.client('ec2')\nc.get_paginator('describe_spot_price_history')\n",
            {"ec2:DescribeSpotPriceHistory"},
        ),
        (
            "import boto3\np = boto3.client('pricing')\np.get_products(ServiceCode='AmazonEC2')\n",
            {"pricing:GetProducts"},
        ),
        ("import boto3\nboto3.client('sts').get_caller_identity()\n", set()),
        (
            "from libcloud.compute.drivers.ec2 import EC2NodeDriver\nd.destroy_node(n)\n",
            {"ec2:TerminateInstances"},
        ),
        (
            "from libcloud.compute.drivers.ec2 import EC2NodeDriver\nd.create_node(name='x', size=s, image=i)\n",
            {"ec2:RunInstances", "ec2:CreateTags"},
        ),
        (
            "from libcloud.compute.drivers.ec2 import EC2NodeDriver\n"
            "d.create_node(name='x', size=s, image=i, auth=k)\n",
            {"ec2:RunInstances", "ec2:CreateTags", "ec2:DescribeKeyPairs", "ec2:ImportKeyPair"},
        ),
        (
            "from azure.mgmt.compute import ComputeManagementClient\nc.virtual_machines.begin_delete('g', 'v')\n",
            {"Microsoft.Compute/virtualMachines/delete"},
        ),
        (
            "from azure.mgmt.compute import ComputeManagementClient\nvms = c.virtual_machines\nvms.get('g', 'v')\n",
            {"Microsoft.Compute/virtualMachines/read"},
        ),
        ("d.create_node(name='x')\n", set()),
    ],
    ids=[
        "a boto3 EC2 call is its operation's IAM action",
        "a paginator named by string is its operation's action",
        "the price list API is a pricing action",
        "the caller identity needs no permission",
        "libcloud destroy_node sends TerminateInstances",
        "libcloud create_node sends RunInstances and tags at launch",
        "create_node with an SSH key also imports the key pair",
        "an azure-mgmt-compute delete is the delete action",
        "an operation group held in a variable is still followed",
        "a file using no cloud SDK needs nothing",
    ],
)
def test_scanner_maps_sdk_calls_to_permissions(tmp_path: Path, code: str, expected: set[str]) -> None:
    scan = scan_providers(_write(tmp_path, "adapter.py", code))
    found = set().union(*(scan.of(c) for c in ("aws", "azure", "gcp")))
    assert found == expected


@pytest.mark.parametrize(
    ("method", "url", "action"),
    [
        ("GET", "/subscriptions/{s}/providers/Microsoft.Compute/skus", "Microsoft.Compute/skus/read"),
        (
            "GET",
            "/subscriptions/{s}/providers/Microsoft.Compute/locations/{l}/vmSizes",
            "Microsoft.Compute/locations/vmSizes/read",
        ),
        (
            "PUT",
            "/subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.Compute/virtualMachines/{v}",
            "Microsoft.Compute/virtualMachines/write",
        ),
        (
            "POST",
            "/subscriptions/{s}/resourceGroups/{g}/providers/Microsoft.Compute/virtualMachines/{v}/start",
            "Microsoft.Compute/virtualMachines/start/action",
        ),
    ],
    ids=["a subscription list is read", "a nested type keeps its parent", "PUT is write", "POST verb is action"],
)
def test_azure_urls_map_to_rbac_actions(method: str, url: str, action: str) -> None:
    assert azure_action(method, url) == action


@pytest.mark.parametrize(
    ("path", "method", "permission"),
    [
        ("/zones/{}/instances", "POST", "compute.instances.create"),
        ("/zones/{}/instances/{}", "DELETE", "compute.instances.delete"),
        ("/aggregated/machineTypes", "GET", "compute.machineTypes.list"),
        ("/zones/{}/instances/{}/setLabels", "POST", "compute.instances.setLabels"),
        ("/projects/{}/global/images/family/{}", "GET", "compute.images.getFromFamily"),
        ("/setCommonInstanceMetadata", "POST", "compute.projects.setCommonInstanceMetadata"),
    ],
    ids=["insert is create", "delete", "aggregated list is list", "custom verb", "image family", "project verb"],
)
def test_gce_paths_map_to_iam_permissions(path: str, method: str, permission: str) -> None:
    assert gce_permission(path, method) == permission


# --- the real adapters against the real modules -----------------------------------------------------


@pytest.fixture(scope="module")
def scan() -> Any:
    providers = REPO / "providers"
    if not providers.is_dir():
        pytest.skip("providers/ does not exist yet")
    return scan_providers(providers)


def _need(scan: Any, cloud: str) -> set[str]:
    found: set[str] = scan.of(cloud)
    if not found:
        pytest.skip(f"no {cloud} SDK call found in providers/ yet; the check starts when the adapter exists")
    return found


def _diff_message(cloud: str, need: set[str], granted: set[str]) -> str:
    return (
        f"{cloud}: missing {sorted(need - granted)}, not needed {sorted(granted - need)}. To fix: update "
        f"terraform/modules/provider-identity-{cloud} and its README (python -m tests.terraform.permscan {cloud})."
    )


def test_aws_identity_grants_exactly_what_providers_call(scan: Any) -> None:
    need, granted = _need(scan, "aws"), _aws_granted()
    assert need == granted, _diff_message("aws", need, granted)


def test_azure_identity_grants_exactly_what_providers_call(scan: Any) -> None:
    need = _need(scan, "azure")
    roles = _azure_granted()
    granted = roles["catalog"] | roles["lifecycle"]
    assert need == granted, _diff_message("azure", need, granted)
    # Resource-group operations belong to the role assigned on the workload resource group only.
    assert scan.azure_resource_group_scoped & roles["catalog"] == set()


def test_gcp_identity_grants_exactly_what_providers_call(scan: Any) -> None:
    need, granted = _need(scan, "gcp"), _gcp_granted()
    assert need == granted, _diff_message("gcp", need, granted)


@pytest.mark.parametrize(
    ("cloud", "granted"),
    [("aws", _aws_granted), ("azure", lambda: set().union(*_azure_granted().values())), ("gcp", _gcp_granted)],
    ids=["aws", "azure", "gcp"],
)
def test_identity_readme_lists_every_permission(cloud: str, granted: Any) -> None:
    readme = (MODULES / f"provider-identity-{cloud}" / "README.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.M))
    assert listed == granted(), f"README of provider-identity-{cloud} lists {sorted(listed ^ granted())} wrongly"


def test_aws_mutating_actions_are_scoped_by_tag() -> None:
    doc = dict(blocks(MODULES / "provider-identity-aws", "data"))["aws_iam_policy_document.provisioning"]
    for st in doc["statement"]:
        mutating = [a for a in st["actions"] if not re.match(r"ec2:(Describe|Get|List)", a)]
        if not mutating or st["sid"] == "LaunchWithTheseResources":
            continue
        conditions = st.get("condition", [])
        variables = {c["variable"] for c in conditions}
        assert any("Tag/" in v or v == "ec2:CreateAction" for v in variables), f"{st['sid']} is unscoped"


def test_permscan_module_parses() -> None:
    source = (Path(__file__).parent / "permscan.py").read_text()
    assert "__all__" in {t.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Assign) for t in n.targets
                         if isinstance(t, ast.Name)}


def test_gcp_workload_identity_principals_may_only_impersonate_the_service_account() -> None:
    """Federated principals get roles/iam.workloadIdentityUser on the provisioning service account only (no
    project role, no key); none by default, and a value that is not a pool principal is refused."""
    gcp = MODULES / "provider-identity-gcp"
    res = dict(blocks(gcp, "resource"))
    binding = res["google_service_account_iam_member.workload_identity"]
    assert unquote(binding["role"]) == "roles/iam.workloadIdentityUser"
    assert "google_service_account.this.name" in str(binding["service_account_id"])
    assert "var.workload_identity_principals" in str(binding["for_each"])
    assert not any(k.startswith("google_project_iam") and "workloadIdentity" in str(v) for k, v in res.items())
    var = dict(blocks(gcp, "variable"))["workload_identity_principals"]
    assert var["default"] == [] and "principal(Set)?://" in str(var["validation"])
