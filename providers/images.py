"""Which boot image a job's VM gets, per cloud, CPU architecture and whether the instance type has GPUs.

Placement hands the adapters an offer whose instance type carries its ``arch`` (``amd64``/``arm64``) and
``gpus``; an arm64 type booted from an x86 image does not start, and a GPU type without NVIDIA drivers runs
the job without its GPUs. Defaults (every one can be replaced through the adapter's ``images`` option, a
mapping ``{"amd64": ..., "arm64": ..., "amd64-gpu": ..., "arm64-gpu": ...}``):

========  ==================================================  ==================================================
cloud     CPU                                                 GPU (NVIDIA drivers installed)
========  ==================================================  ==================================================
aws       Amazon Linux 2023 (``al2023-ami-2023*-<arch>``)     AWS Deep Learning Base OSS Nvidia Driver GPU AMI
                                                              (Amazon Linux 2023; ARM64 variant for Graviton)
azure     Canonical Ubuntu 22.04 (``22_04-lts-gen2`` /         Ubuntu HPC 22.04 (``microsoft-dsvm:ubuntu-hpc``:
          ``22_04-lts-arm64``)                                NVIDIA driver, CUDA, InfiniBand) with the adapter's
                                                              ``gpu_driver="image"``; by default the CPU image
                                                              plus the NVIDIA GPU Driver Extension
gcp       Debian 12 (``debian-12`` / ``debian-12-arm64``)      Deep Learning VM (``deeplearning-platform-release``
                                                              family ``common-cu124-debian-11-py310``, with
                                                              metadata ``install-nvidia-driver=True``)
========  ==================================================  ==================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import InvalidRequestError
from broker.model import InstanceType

__all__ = ["image_key", "AWS_IMAGE_NAMES", "AZURE_IMAGES", "GCP_IMAGES", "pick"]

# AMI name patterns of Amazon's own images (owner "amazon"), newest CreationDate wins.
AWS_IMAGE_NAMES = {
    "amd64": "al2023-ami-2023*-x86_64",
    "arm64": "al2023-ami-2023*-arm64",
    "amd64-gpu": "Deep Learning Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *",
    "arm64-gpu": "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Amazon Linux 2023) *",
}
AZURE_IMAGES: dict[str, dict[str, str]] = {
    "amd64": {"publisher": "Canonical", "offer": "0001-com-ubuntu-server-jammy", "sku": "22_04-lts-gen2",
              "version": "latest"},
    "arm64": {"publisher": "Canonical", "offer": "0001-com-ubuntu-server-jammy", "sku": "22_04-lts-arm64",
              "version": "latest"},
    "amd64-gpu": {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"},
}
GCP_IMAGES = {
    "amd64": "projects/debian-cloud/global/images/family/debian-12",
    "arm64": "projects/debian-cloud/global/images/family/debian-12-arm64",
    "amd64-gpu": "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310",
}


def image_key(shape: InstanceType) -> str:
    """``amd64``, ``arm64``, ``amd64-gpu`` or ``arm64-gpu`` for an instance type."""
    arch = "arm64" if shape.arch == "arm64" else "amd64"
    return f"{arch}-gpu" if shape.gpus else arch


def pick(provider: str, shape: InstanceType, defaults: Mapping[str, Any], override: Mapping[str, Any] | None,
         *, region: str | None = None) -> Any:
    """The image of ``shape``: ``override[key]`` when given, else ``defaults[key]`` (see :func:`image_key`).
    Raises :class:`InvalidRequestError` when the cloud has no image for that kind (e.g. Azure arm64 + GPU)."""
    key = image_key(shape)
    table = dict(defaults) | dict(override or {})
    image = table.get(key)
    if image is None:
        raise InvalidRequestError(
            f"{provider}: no {key} boot image for {shape.name}. To fix: set the adapter's images option "
            f"(e.g. images={{'{key}': ...}}) or place the job on another instance type.",
            provider=provider, region=region,
        )
    return image
