"""Registry, lazy imports, credentials check, the fake and the dry-run provider, and the public names."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

import providers
from broker.clock import ManualClock
from broker.errors import InvalidRequestError
from broker.model import InstanceState
from providers import registry
from providers.base import TAG_DRY_RUN, TAG_JOB, Capability, Provider
from providers.dryrun import DryRunProvider
from providers.fake import FakeProvider

from .builders import make_job, make_offer

BLOCKER = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('boto3', 'botocore', 'azure', 'libcloud', 'httpx'):
            raise ImportError('blocked ' + name)
sys.meta_path.insert(0, Block())
import providers
from providers import registry
p = registry.create('fake')
checks = {c.name: c for c in registry.check()}
assert not checks['aws'].usable and 'not installed' in checks['aws'].reason, checks['aws']
assert not checks['azure'].usable and 'not installed' in checks['azure'].reason, checks['azure']
try:
    registry.create('aws')
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_import_providers_works_without_boto3_azure_or_libcloud() -> None:
    r = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("AuthError") and "pip install 'hybrid-broker[aws]'" in r.stdout


def test_names_lists_every_provider() -> None:
    assert registry.names() == ["aws", "azure", "dryrun", "fake", "gcp", "onprem", "ray", "slurm"]


def test_create_rejects_an_unknown_name_with_the_known_ones() -> None:
    with pytest.raises(InvalidRequestError, match="one of aws, azure"):
        registry.create("nope")


def test_check_without_credentials_says_why_and_how_to_fix(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AZURE_CLIENT_ID",
                "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    checks = {c.name: c for c in registry.check()}
    assert checks["onprem"].usable
    for cloud in ("aws", "azure", "gcp"):
        assert not checks[cloud].usable and "To fix" in checks[cloud].reason


def test_check_finds_credentials_in_the_standard_chains(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    for k, v in {"AZURE_CLIENT_ID": "c", "AZURE_TENANT_ID": "t", "AZURE_CLIENT_SECRET": "s",
                 "AZURE_SUBSCRIPTION_ID": "sub"}.items():
        monkeypatch.setenv(k, v)
    key = tmp_path / "sa.json"
    key.write_text('{"type": "service_account", "client_email": "sa@p.iam", "project_id": "p"}')
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    checks = {c.name: c for c in registry.check()}
    assert checks["aws"].usable and checks["aws"].credentials_source == "env"
    assert checks["azure"].usable and "client secret" in checks["azure"].credentials_source
    assert checks["gcp"].usable and "sa@p.iam" in checks["gcp"].credentials_source


def test_the_fake_and_dry_run_providers_implement_the_protocol() -> None:
    assert isinstance(FakeProvider(), Provider)
    assert isinstance(DryRunProvider("aws"), Provider)
    assert isinstance(registry.create("fake"), Provider)


def test_dry_run_instances_run_for_the_job_duration_then_succeed_and_say_so() -> None:
    clock = ManualClock()
    p = DryRunProvider("aws", [make_offer("aws", "us-east-1")], clock=clock)
    assert Capability.DRY_RUN in p.capabilities
    [inst] = p.launch(p.offers()[0], 1, "r1", tags={TAG_JOB: "j"}, job=make_job(duration_hours=3))
    assert inst.dry_run and inst.tags[TAG_DRY_RUN] == "true" and inst.id.startswith("dry-aws-")
    assert p.launch(p.offers()[0], 1, "r1", tags={TAG_JOB: "j"})[0].id == inst.id
    clock.advance(timedelta(hours=2.9).total_seconds())
    assert p.instances({TAG_JOB: "j"})[0].state is InstanceState.RUNNING
    clock.advance(timedelta(hours=0.2).total_seconds())
    done = p.instances({TAG_JOB: "j"})[0]
    assert (done.state, done.exit_code) == (InstanceState.SUCCEEDED, 0)
    p.terminate([inst.id], "r2")
    assert p.instances()[0].state is InstanceState.TERMINATED


def test_the_fake_reports_injected_async_errors_once() -> None:
    from broker.errors import CapacityError

    p = FakeProvider()
    p.inject_error(CapacityError("spot reclaimed"))
    assert [str(e) for e in p.poll_errors()] == ["spot reclaimed"]
    assert p.poll_errors() == []


def test_public_names_are_pinned() -> None:
    assert sorted(providers.__all__) == sorted([
        "Capability", "Provider", "ProviderCheck", "TAG_JOB", "TAG_REQUEST", "TAG_DRY_RUN", "FakeProvider",
        "DryRunProvider", "OnPremPool", "Blocklist", "ProvisionOutcome", "provision", "map_errors", "create",
        "check", "names",
    ])
    for name in providers.__all__:
        assert getattr(providers, name) is not None


def test_the_broker_builds_cloud_adapters_with_the_options_of_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from broker.app import build_providers
    from broker.clock import ManualClock
    from broker.config import Settings
    from providers.aws import AwsProvider

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "BROKER_AWS_REGIONS": "eu-west-1, ap-south-1", "BROKER_MAX_RUNTIME_HOURS": "5"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    built = build_providers(Settings(data_dir=tmp_path, providers=("aws",)), ManualClock())
    aws = built["aws"]
    assert isinstance(aws, AwsProvider)
    assert aws.regions == ["eu-west-1", "ap-south-1"] and aws.max_runtime_hours == 5.0


def test_a_bad_runtime_limit_in_the_environment_is_a_clear_error() -> None:
    from broker.errors import InvalidRequestError
    from providers.refresh import options_from_env

    with pytest.raises(InvalidRequestError, match="To fix"):
        options_from_env("gcp", {"BROKER_MAX_RUNTIME_HOURS": "soon"})


AZURE_MI = [
    ("the platform's managed identity endpoint (Container Apps, App Service)",
     {"IDENTITY_ENDPOINT": "http://127.0.0.1:42356/msi/token", "AZURE_CLIENT_ID": "cid-1"}, "client id cid-1"),
    ("a VM's identity when told", {"BROKER_AZURE_MANAGED_IDENTITY": "true"}, "instance metadata"),
]


@pytest.mark.parametrize(("env", "source"), [c[1:] for c in AZURE_MI], ids=[c[0] for c in AZURE_MI])
def test_azure_managed_identity_is_recognised(env, source, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for k in ("AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_CLIENT_ID",
              "IDENTITY_ENDPOINT", "MSI_ENDPOINT", "BROKER_AZURE_MANAGED_IDENTITY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no az login cache
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "sub-1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    [azure] = [c for c in registry.check() if c.name == "azure"]
    assert azure.usable and "managed identity" in azure.credentials_source and source in azure.credentials_source
    from azure.identity import ManagedIdentityCredential

    from providers.azure import AzureProvider

    assert isinstance(AzureProvider()._cred(), ManagedIdentityCredential)
