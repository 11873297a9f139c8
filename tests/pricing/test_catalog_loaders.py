"""Loaders: SkyPilot v8 CSVs (synthetic, written here) and the real shared catalogs; the embedded
Libcloud-built default; load_catalog's merge, env var and cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from broker.errors import CatalogError
from pricing import Catalog, load_catalog, load_embedded
from pricing.skypilot import load_skypilot_dir
from tests.pricing.catalog_builders import SKY_V8, real_catalog, write_csv  # noqa: F401

AWS_H = ("InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,"
         "AvailabilityZone,Arch")
GCP_H = "InstanceType,vCPUs,MemoryGiB,AcceleratorName,AcceleratorCount,GpuInfo,Region,AvailabilityZone,Price,SpotPrice"
AZ_H = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,Generation"


def _offers(cat: Catalog) -> dict[tuple[str, str, str | None, str, str], float]:
    return {
        (o.provider, o.region, o.location.zone, o.instance_type.name, o.capacity.value): o.hourly_usd
        for o in cat.offers(range(len(cat)))
    }


def test_aws_rows_duplicates_zero_prices_and_arch(tmp_path: Path) -> None:
    write_csv(tmp_path / "aws" / "vms.csv", AWS_H, [
        "m6i.large,,,2.0,8.0,,0.096,0.04,us-east-1,use1-az1,x86_64",
        "m6i.large,,,2.0,8.0,,0.096,0.04,us-east-1,use1-az1,x86_64",  # exact duplicate
        "m6g.large,,,2.0,8.0,,0.077,0.0,us-east-1,use1-az1,arm64",  # spot 0.0 = not offered
        "m6i.xlarge,,,4.0,16.0,,0.0,0.0,us-east-1,use1-az1,x86_64",  # neither price: dropped
        "g4dn.xlarge,T4,1.0,4.0,16.0,\"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 16384}}]}\",0.526,0.2,us-east-1,"
        "use1-az2,x86_64",
        "broken,,,x,8.0,,0.1,0.05,us-east-1,use1-az1,x86_64",  # unparsable vCPUs: dropped
    ])
    cat = load_skypilot_dir(tmp_path)
    got = _offers(cat)
    assert got == {
        ("aws", "us-east-1", "use1-az1", "m6i.large", "on-demand"): 0.096,
        ("aws", "us-east-1", "use1-az1", "m6i.large", "spot"): 0.04,
        ("aws", "us-east-1", "use1-az1", "m6g.large", "on-demand"): 0.077,
        ("aws", "us-east-1", "use1-az2", "g4dn.xlarge", "on-demand"): 0.526,
        ("aws", "us-east-1", "use1-az2", "g4dn.xlarge", "spot"): 0.2,
    }
    (p,) = cat.provenance
    assert (p.provider, p.rows, p.dropped, p.duplicates, p.offers) == ("aws", 6, 2, 2, 5)
    arm = cat.query(arch="arm64")
    assert [cat.offer(int(i)).instance_type.name for i in arm] == ["m6g.large"]
    g = cat.offer(int(cat.query(accelerator="T4")[0])).instance_type
    assert (g.gpus, g.accelerator, g.gpu_memory_gib) == (1, "T4", 16.0)


def test_gcp_gpu_rows_combine_with_hosts_in_the_same_zone(tmp_path: Path) -> None:
    write_csv(tmp_path / "gcp" / "vms.csv", GCP_H, [
        "n1-standard-8,8.0,30.0,,,,us-central1,us-central1-a,0.38,0.08",
        "n1-standard-96,96.0,360.0,,,,us-central1,us-central1-a,4.56,1.0",
        "a2-highgpu-1g,12.0,85.0,,,,us-central1,us-central1-a,0.94,0.47",
        "a2-highgpu-1g,12.0,85.0,,,,us-central1,us-central1-b,0.94,0.47",  # no A100 row in zone b: dropped
        ",,,A100,1,\"{'Gpus': [{'MemoryInfo': {'SizeInMiB': 40960}}]}\",us-central1,us-central1-a,2.93,1.43",
        ",,,T4,1,,us-central1,us-central1-a,0.35,0.16",
        ",,,T4,1,,us-central1,us-central1-a,0.35,0.16",  # duplicate GPU row
        ",,,tpu-v5litepod-8,1,,us-central1,us-central1-a,9.6,4.0",  # TPU: dropped
        "g2-standard-4,4.0,16.0,,,,us-central1,us-central1-a,0.17,0.06",
        ",,,L4,1,,us-central1,us-central1-a,0.56,0.23",
    ])
    cat = load_skypilot_dir(tmp_path)
    got = _offers(cat)
    z = "us-central1-a"
    assert got[("gcp", "us-central1", z, "a2-highgpu-1g", "on-demand")] == pytest.approx(0.94 + 2.93)
    assert got[("gcp", "us-central1", z, "a2-highgpu-1g", "spot")] == pytest.approx(0.47 + 1.43)
    assert got[("gcp", "us-central1", z, "n1-standard-8+T4:1", "on-demand")] == pytest.approx(0.38 + 0.35)
    assert got[("gcp", "us-central1", z, "g2-standard-4", "on-demand")] == pytest.approx(0.17 + 0.56)
    # T4:1 takes at most 48 vCPUs: n1-standard-96 gets no T4; zone b has no A100 price
    assert ("gcp", "us-central1", z, "n1-standard-96+T4:1", "on-demand") not in got
    assert not any(k[2] == "us-central1-b" for k in got)
    assert got[("gcp", "us-central1", z, "n1-standard-96", "on-demand")] == 4.56
    a100 = cat.offer(int(cat.query(accelerator="A100")[0])).instance_type
    assert (a100.gpus, a100.vcpus, a100.gpu_memory_gib) == (1, 12.0, 40.0)
    (p,) = cat.provenance
    assert p.duplicates == 1 and p.dropped == 2  # the TPU row and the A100 host without a GPU price


def test_azure_fractional_gpus_dropped_and_outlier_flagged(tmp_path: Path) -> None:
    rows = [f"Standard_F4ams_v6,,,4,32,,{p},{p / 5:.4f},{r},V1,V2" for p, r in
            [(0.231, "eastus"), (0.30, "westeurope"), (0.358, "japaneast"), (0.0449, "newzealandnorth")]]
    rows.append("Standard_NV6ads_A10_v5,A10,0.167,6,55,,0.45,0.1,eastus,V2")
    write_csv(tmp_path / "azure" / "vms.csv", AZ_H, rows)
    cat = load_skypilot_dir(tmp_path)
    assert cat.accelerator_code("A10") is None
    flagged = {(cat.offer(int(i)).region, cat.offer(int(i)).capacity.value) for i in np.flatnonzero(cat.outlier)}
    assert flagged == {("newzealandnorth", "on-demand"), ("newzealandnorth", "spot")}
    (p,) = cat.provenance
    assert p.outliers == 2 and p.dropped == 1


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (None, "does not exist"),
        ({}, "holds no aws/, azure/ or gcp/ vms.csv"),
        ({"aws/vms.csv": "a,b,c\n1,2,3\n"}, "not a SkyPilot v8 vms.csv"),
    ],
    ids=["a missing directory", "an empty directory", "a file with the wrong header"],
)
def test_bad_catalog_dirs_raise_a_catalog_error(tmp_path: Path, layout: dict[str, str] | None,
                                                 message: str) -> None:
    d = tmp_path / "cat"
    if layout is not None:
        d.mkdir()
        for rel, text in layout.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
    with pytest.raises(CatalogError, match=message):
        load_skypilot_dir(d)


def test_embedded_catalog_is_built_from_libcloud_package_data() -> None:
    cat = load_embedded()
    assert {p.provider for p in cat.provenance} == {"aws", "azure", "gcp"}
    libcloud = [p for p in cat.provenance if p.source.startswith("libcloud-")]
    assert libcloud and all(p.date == "2025-03-02" for p in libcloud)
    listed = [p for p in cat.provenance if p.source == "list-prices.csv"]
    assert {p.provider for p in listed} == {"aws", "azure", "gcp"} and all(p.date == "2025-06-15" for p in listed)
    assert len(cat.provenance) == len(libcloud) + len(listed)
    got = _offers(cat)
    assert got[("aws", "us-east-1", None, "m5.large", "on-demand")] == 0.096
    assert got[("gcp", "us-central1", None, "n2-standard-4", "on-demand")] == pytest.approx(0.194236, abs=1e-5)
    assert ("azure", "eastus", None, "Standard_D2s_v3", "on-demand") in got
    assert ("azure", "eastus", None, "Standard_D2s_v3", "spot") in got  # lowpriority prices
    p4d = [o for o in cat.offers(cat.query(accelerator="A100")) if o.instance_type.name == "p4d.24xlarge"]
    assert p4d and p4d[0].instance_type.gpus == 8 and p4d[0].instance_type.vcpus == 96
    assert cat.offer(int(cat.query(arch="arm64")[0])).instance_type.name.split(".")[0][-1] in "gd"
    d2 = [o for o in cat.offers(range(len(cat))) if o.instance_type.name == "Standard_D2s_v3"][0]
    assert (d2.instance_type.vcpus, d2.instance_type.memory_gib) == (2, 8)


def test_load_catalog_merges_caches_and_reads_the_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROKER_DATA_DIR", str(tmp_path / "data"))
    write_csv(tmp_path / "cat" / "aws" / "vms.csv", AWS_H, ["m5.large,,,2.0,8.0,,0.5,,us-east-1,use1-az1,x86_64"])
    monkeypatch.setenv("BROKER_CATALOG_DIR", str(tmp_path / "cat"))
    cat = load_catalog()
    got = _offers(cat)
    assert got[("aws", "us-east-1", "use1-az1", "m5.large", "on-demand")] == 0.5
    assert ("aws", "us-east-1", None, "m5.large", "on-demand") not in got  # the loaded catalog won
    assert list((tmp_path / "data" / "cache").glob("catalog-*.npz"))
    again = load_catalog()
    assert again.version == cat.version
    only = load_catalog(tmp_path / "cat", include_embedded=False)
    assert len(only) == 1
    with pytest.raises(CatalogError):
        load_catalog(tmp_path / "nope")


def test_real_shared_catalogs_load_with_their_quirks(real_catalog: Catalog) -> None:  # noqa: F811
    cat = real_catalog
    assert len(cat) > 150_000
    by = {(p.provider, p.source.split(":")[0]): p for p in cat.provenance}
    assert by[("azure", "skypilot-v8")].rows == 56_671
    assert by[("gcp", "skypilot-v8")].rows == 31_285
    assert by[("gcp", "skypilot-v8")].duplicates > 0
    assert by[("azure", "skypilot-v8")].outliers > 0
    nz = [i for i in np.flatnonzero(cat.outlier) if cat.offer(int(i)).instance_type.name == "Standard_F4ams_v6"]
    assert any(cat.offer(int(i)).region == "newzealandnorth" for i in nz)
    assert cat.query(accelerator="A100", gpus=8, providers=["gcp"]).size > 0
    assert cat.query(accelerator="T4", providers=["gcp"]).size > 0


def test_version_does_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    import subprocess
    import sys

    rows = [f"t{i % 7}.large,,,2.0,8.0,,{0.1 + i / 100:.3f},{0.05 + i / 200:.3f},r-{i % 11},z{i % 3},x86_64"
            for i in range(60)]
    write_csv(tmp_path / "aws" / "vms.csv", AWS_H, rows)
    code = f"from pricing.skypilot import load_skypilot_dir; print(load_skypilot_dir({str(tmp_path)!r}).version)"
    versions = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)}).stdout.strip()
        for seed in (1, 2, 3)
    }
    assert len(versions) == 1 and next(iter(versions))
