"""What the device offers: CPUs, memory, GPUs, architecture, free disk; and link measurements."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["capacity", "measure_bandwidth_mbps", "machine_arch"]

_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def machine_arch() -> str:
    m = platform.machine().lower()
    return _ARCH.get(m, m)


def capacity(state_dir: Path) -> dict[str, Any]:
    """vCPUs, memory (GiB), NVIDIA GPUs (``/dev/nvidiaN``), arch, free disk (GiB) of the state dir."""
    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = 0.0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return {
        "vcpus": cpus,
        "memory_gib": round(mem_gib, 2),
        "gpus": len([p for p in glob.glob("/dev/nvidia[0-9]*") if p[len("/dev/nvidia"):].isdigit()]),
        "arch": machine_arch(),
        "disk_gib": round(shutil.disk_usage(state_dir).free / 2**30, 2),
    }


def measure_bandwidth_mbps(broker_url: str, *, nbytes: int = 1 << 20, timeout_s: float = 10.0,
                           ssl_context: Any = None) -> float | None:
    """Download ``nbytes`` from the broker's probe endpoint and return Mbit/s (``None`` on failure)."""
    if not broker_url:
        return None
    url = f"{broker_url.rstrip('/')}/v1/edge/probe?bytes={nbytes}"
    try:
        t0 = time.perf_counter()
        with urllib.request.urlopen(url, timeout=timeout_s, context=ssl_context) as resp:  # noqa: S310
            n = len(resp.read())
        dt = max(time.perf_counter() - t0, 1e-6)
    except (OSError, ValueError):
        return None
    return round(n * 8 / dt / 1e6, 2)
