"""Boot images follow the placed instance type: arm64 types get arm64 images, GPU types images with NVIDIA
drivers, on each cloud; the architecture survives from placement to the adapter's offer."""

from __future__ import annotations

import boto3
import pytest

from broker.errors import InvalidRequestError
from broker.model import Capacity, InstanceType, Location, Offer
from providers.aws import AwsProvider
from providers.azure import AzureProvider
from providers.base import TAG_REQUEST, offer_from_option
from providers.gcp import GcpProvider
from providers.images import image_key

from .builders import make_option
from .conftest import GCP_PROJECT, FakeCredential

ARM = InstanceType("arm.2x", 2, 8, arch="arm64")
X86 = InstanceType("x86.2x", 2, 8)
GPU = InstanceType("gpu.4x", 4, 16, gpus=1, accelerator="T4")
ARM_GPU = InstanceType("armgpu.4x", 4, 16, gpus=1, accelerator="T4G", arch="arm64")


def _offer(provider: str, region: str, shape: InstanceType) -> Offer:
    return Offer(shape, Location(provider, region, None), Capacity.ON_DEMAND, 1.0)


def test_the_architecture_of_the_placed_option_reaches_the_offer() -> None:
    import dataclasses

    option = dataclasses.replace(make_option("aws", "us-east-1", "m7g.large", 0.08), arch="arm64")
    assert offer_from_option(option).instance_type.arch == "arm64"
    assert [image_key(s) for s in (X86, ARM, GPU, ARM_GPU)] == ["amd64", "arm64", "amd64-gpu", "arm64-gpu"]


@pytest.mark.network
def test_aws_picks_the_amazon_linux_image_of_the_architecture(moto_endpoint: str) -> None:
    aws = AwsProvider(["us-east-1"], endpoint_url=moto_endpoint, access_key="testing", secret_key="testing",
                      images={"amd64-gpu": "ami-0dlgpu00000000001"})
    ec2 = boto3.client("ec2", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    arches = {}
    for shape in (X86, ARM):
        ami = aws._image("us-east-1", shape)
        [img] = ec2.describe_images(ImageIds=[ami])["Images"]
        arches[shape.arch] = (img["Architecture"], img["Name"])
    assert arches["amd64"][0] == "x86_64" and arches["arm64"][0] == "arm64"
    assert all(name.startswith("al2023-ami-2023") for _, name in arches.values())
    assert aws._image("us-east-1", GPU) == "ami-0dlgpu00000000001"  # configured GPU image


@pytest.mark.network
def test_aws_without_a_gpu_image_says_how_to_configure_one(moto_endpoint: str) -> None:
    aws = AwsProvider(["us-east-1"], endpoint_url=moto_endpoint, access_key="testing", secret_key="testing")
    with pytest.raises(InvalidRequestError, match="To fix"):  # moto has no Deep Learning AMI
        aws._image("us-east-1", GPU)


@pytest.mark.parametrize(("gpu_driver", "gpu_sku", "waits"), [
    ("extension", "22_04-lts-gen2", True), ("image", "2204", False), ("both", "2204", True)],
    ids=["by default a GPU VM boots Ubuntu and its driver comes from the NVIDIA extension",
         "gpu_driver=image boots the Ubuntu-HPC image, driver built in",
         "gpu_driver=both boots Ubuntu-HPC and adds the extension too"])
def test_azure_images_by_kind(gpu_driver: str, gpu_sku: str, waits: bool) -> None:
    from .builders import make_job

    az = AzureProvider("sub-1", credential=FakeCredential(), ssh_public_key="ssh-ed25519 AAAA test",
                       gpu_driver=gpu_driver)
    nic = "/subscriptions/sub-1/resourceGroups/g/providers/Microsoft.Network/networkInterfaces/n"
    sku = {s.name: az._vm_body(_offer("azure", "eastus", s, ), "vm", {TAG_REQUEST: "r"}, nic)["properties"][
        "storageProfile"]["imageReference"]["sku"] for s in (X86, ARM, GPU)}
    assert sku == {"x86.2x": "22_04-lts-gen2", "arm.2x": "22_04-lts-arm64", "gpu.4x": gpu_sku}
    assert az._driver_extension(_offer("azure", "eastus", GPU)) is waits
    assert not az._driver_extension(_offer("azure", "eastus", X86))
    job = make_job("g", command=("true",))
    import base64

    script = base64.b64decode(az._vm_body(_offer("azure", "eastus", GPU), "vm", {}, nic, job)["properties"][
        "osProfile"]["customData"]).decode()
    assert ("until nvidia-smi" in script) is waits
    with pytest.raises(InvalidRequestError, match="arm64-gpu"):
        az._vm_body(_offer("azure", "eastus", ARM_GPU), "vm", {}, nic)


def test_gcp_images_by_kind_and_the_driver_install_flag(gcp_creds: dict[str, str]) -> None:
    gcp = GcpProvider(GCP_PROJECT, zones=["us-central1-a"], credentials_file=gcp_creds["key"],
                      token_cache=gcp_creds["token"])
    bodies = {s.name: gcp.instance_body(_offer("gcp", "us-central1", s), "us-central1-a", "hb-x", {})
              for s in (X86, ARM, GPU)}
    images = {k: b["disks"][0]["initializeParams"]["sourceImage"].rsplit("/", 1)[-1] for k, b in bodies.items()}
    assert images == {"x86.2x": "debian-12", "arm.2x": "debian-12-arm64", "gpu.4x": "common-cu124-debian-11-py310"}
    meta = {i["key"]: i["value"] for i in bodies["gpu.4x"]["metadata"]["items"]}
    assert meta["install-nvidia-driver"] == "True"
    assert bodies["gpu.4x"]["scheduling"]["onHostMaintenance"] == "TERMINATE"
