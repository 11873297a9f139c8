"""`broker catalog refresh` against the fakes makes a new catalog version that placement uses, and
`broker providers check` prints a clear table with no credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.errors import TransientError
from broker.model import Request, SpotPolicy
from providers.aws import AwsProvider
from providers.azure import AzureProvider
from providers.refresh import options_from_env, refresh_catalog

from .conftest import FakeCredential
from .faultproxy import FaultProxy, request, throttle

pytestmark = pytest.mark.network
BROKER = [sys.executable, "-c", "from broker.cli import main; main()"]


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "AZURE_", "GOOGLE_", "BROKER_"))}
    env.update({"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "COLUMNS": "120"}, **extra)
    return env


@pytest.fixture
def factory(aws_proxy: FaultProxy, arm_faults: FaultProxy, fixture_http: str, pki):
    def make(name: str):
        if name == "aws":
            return AwsProvider(["us-east-1"], endpoint_url=aws_proxy.url, access_key="testing",
                               secret_key="testing", price_list_url=fixture_http + "/aws/{region}.json")
        return AzureProvider("sub-1", regions=["eastus"], credential=FakeCredential(), base_url=arm_faults.url,
                             connection_verify=pki.ca_cert, prices_url=arm_faults.url + "/api/retail/prices")
    return make


def test_refresh_makes_a_new_version_that_placement_uses(factory, tmp_path: Path) -> None:
    from pricing import CatalogStore, load_egress

    store = CatalogStore(tmp_path)
    version = refresh_catalog(["aws", "azure"], store, providers_factory=factory)
    assert store.current() == version
    catalog = store.load(version)
    assert len(catalog) == 4 + 3 + 3  # aws on-demand; azure on-demand and spot
    place = pytest.importorskip("policies.placement").place
    req = Request(name="r", vcpus=2, memory_gib=8, providers=("aws", "azure"), spot=SpotPolicy.ALLOWED)
    result = place(req, catalog, load_egress(None))
    assert result.placement is not None
    best = result.placement
    assert (best.provider, best.region, best.instance_type, best.capacity) == (
        "azure", "eastus", "Standard_D2s_v5", "spot")
    assert best.hourly_usd == pytest.approx(0.0192)


def test_a_failing_provider_saves_nothing(factory, arm_faults: FaultProxy, tmp_path: Path) -> None:
    from pricing import CatalogStore

    arm_faults.add(request("GET", "/api/retail/prices"), throttle(), times=-1)
    store = CatalogStore(tmp_path)
    with pytest.raises(TransientError, match="refresh of azure failed"):
        refresh_catalog(["aws", "azure"], store, providers_factory=factory)
    assert store.versions() == []


def test_options_come_from_the_environment() -> None:
    env = {"BROKER_AWS_REGIONS": "us-east-1, eu-west-1", "BROKER_AWS_ENDPOINT_URL": "http://127.0.0.1:1",
           "BROKER_AZURE_BASE_URL": "https://127.0.0.1:2", "BROKER_CA_BUNDLE": "/ca.pem"}
    assert options_from_env("aws", env) == {"regions": ["us-east-1", "eu-west-1"],
                                            "endpoint_url": "http://127.0.0.1:1"}
    assert options_from_env("azure", env) == {"base_url": "https://127.0.0.1:2", "connection_verify": "/ca.pem"}


@pytest.mark.slow
def test_cli_catalog_refresh_against_moto(aws_proxy: FaultProxy, fixture_http: str, tmp_path: Path) -> None:
    env = clean_env(tmp_path, BROKER_AWS_ENDPOINT_URL=aws_proxy.url, BROKER_AWS_REGIONS="eu-west-1",
                    BROKER_AWS_PRICE_LIST_URL=fixture_http + "/aws/{region}.json",
                    AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    r = subprocess.run([*BROKER, "catalog", "refresh", "--provider", "aws", "--data-dir", str(tmp_path / "d")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    from pricing import CatalogStore

    store = CatalogStore(tmp_path / "d")
    [(version, _, label)] = store.versions()
    assert version in r.stdout and "aws" in label
    m5 = [o for o in store.load(version).offers(range(len(store.load(version))))
          if o.instance_type.name == "m5.large"]
    assert [(o.region, o.hourly_usd) for o in m5] == [("eu-west-1", pytest.approx(0.1056))]


@pytest.mark.slow
def test_cli_refresh_of_an_unknown_provider_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([*BROKER, "catalog", "refresh", "--provider", "oracle", "--data-dir", str(tmp_path)],
                       env=clean_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "To fix" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_providers_check_without_credentials_prints_a_table_and_exits_0(tmp_path: Path) -> None:
    r = subprocess.run([*BROKER, "providers", "check"], env=clean_env(tmp_path), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for name in ("onprem", "aws", "azure", "gcp"):
        assert name in r.stdout
    assert "no (dry-run)" in r.stdout and "1 of 4 providers usable: onprem" in r.stdout
    j = subprocess.run([*BROKER, "providers", "check", "--json"], env=clean_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    import json

    assert [c["usable"] for c in json.loads(j.stdout)] == [True, False, False, False]
