"""Issue 17: memory stays bounded while jobs with large specs pass through the scheduler."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.spec_cache import SpecCache

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_cache_is_bounded_in_entries_and_bytes_and_forgets_ended_jobs() -> None:
    cache: SpecCache[str] = SpecCache(max_entries=3, max_bytes=100)
    for i in range(5):
        cache.put(f"j{i}", f"spec{i}", 10)
    assert len(cache) == 3 and cache.get("j0") is None and cache.get("j4") == "spec4"
    cache.get("j2")  # used: kept over j3
    cache.put("big", "x", 70)
    assert cache.bytes <= 100 and cache.get("j2") == "spec2" and cache.get("j3") is None
    cache.put("huge", "y", 101)
    assert cache.get("huge") is None, "a spec larger than the whole bound is never kept"
    cache.discard(["j2", "big", "nope"])
    assert cache.get("j2") is None and cache.bytes == sum(10 for k in ("j4",) if cache.get(k))


@pytest.mark.slow
def test_rss_after_400_finished_100_kib_jobs_stays_within_50_mib_of_the_start() -> None:
    """The bounded variant of ``bench/finished_jobs_rss.py`` (10,000 jobs there; figures in BENCHMARKS.md)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "finished_jobs_rss.py"), "--jobs", "400"],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    fields = dict(kv.split("=") for kv in done.stdout.strip().splitlines()[-1].split()[1:])
    # 10,000 jobs stay within 50 MiB (bench); 400 within 30 MiB here (the unbounded cache grew ~52 MiB)
    assert float(fields["growth_mib"]) < 30, fields
    assert int(fields["cache_entries"]) == 0, "every job ended, so no parsed spec is kept"
