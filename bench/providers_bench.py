"""Benchmark of the providers area: failover overhead, on-prem run latency, the cloud job script (build,
run under sh until its report, parse) and the orphan sweeper's decision over many instances.

Run: .venv/bin/python bench/providers_bench.py
Prints figures and ends with one summary line. Loopback/in-process only; bounded in count and time.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.clock import ManualClock  # noqa: E402
from broker.errors import CapacityError  # noqa: E402
from broker.model import InstanceState, JobSpec, PlacementOption, Request, RetryPolicy  # noqa: E402
from providers.base import offer_from_option  # noqa: E402
from providers.failover import provision  # noqa: E402
from providers.fake import FakeProvider  # noqa: E402
from providers.onprem import OnPremPool  # noqa: E402


def option(region: str) -> PlacementOption:
    return PlacementOption("fake", region, None, "m.large", "on-demand", 2, 8, 0, None, 1.0, 1.0, 0.0, 0.0, 1.0)


def per_call_us(fn, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    n = 5000
    opts = [option(f"r{i}") for i in range(5)]
    direct = FakeProvider("fake")
    offer = offer_from_option(opts[0])
    base_us = per_call_us(lambda i: direct.launch(offer, 1, f"d{i}", tags={}), n)
    ok = FakeProvider("fake")
    clock = ManualClock()
    rng = random.Random(1)
    prov_us = per_call_us(lambda i: provision(opts, lambda _: ok, request_id=f"p{i}", tags={}, job=None,
                                              retry=RetryPolicy(), clock=clock, rng=rng), n)

    def fail_first4(offer, count, request_id):
        return CapacityError("full") if offer.region != "r4" else None

    def failover_once(i: int) -> None:
        flaky = FakeProvider("fake", fail=fail_first4)  # fresh: its by-tag listing is a linear scan
        provision(opts, lambda _: flaky, request_id=f"f{i}", tags={}, job=None, retry=RetryPolicy(),
                  clock=clock, rng=rng)

    fresh_us = per_call_us(lambda i: FakeProvider("fake", fail=fail_first4), n)
    fo_us = per_call_us(failover_once, n) - fresh_us
    print(f"direct FakeProvider.launch:            {base_us:8.1f} us/call  (n={n})")
    print(f"provision, first option works:         {prov_us:8.1f} us/call  ({prov_us / base_us:.1f}x direct)")
    print(f"provision, 4 capacity errors then ok:  {fo_us:8.1f} us/call  ({fo_us / base_us:.1f}x direct)")

    runs = 20
    lat = []
    with tempfile.TemporaryDirectory() as d:
        pool = OnPremPool(None, d)
        job = JobSpec(name="b", request=Request(name="b", vcpus=0.1, memory_gib=0.01), command=("true",))
        host_offer = pool.offers()[0]
        for i in range(runs):
            t = time.perf_counter()
            [inst] = pool.launch(host_offer, 1, f"b{i}", tags={}, job=job)
            while pool.instance(inst.id).state is InstanceState.RUNNING:
                time.sleep(0.002)
            lat.append((time.perf_counter() - t) * 1000)
    med = statistics.median(lat)
    p90 = sorted(lat)[int(0.9 * runs) - 1]
    print(f"onprem launch -> exit recorded ('true'): median {med:.1f} ms, p90 {p90:.1f} ms (n={runs})")
    script_us, parse_us, run_ms, sweep_ms = cloud_jobs()
    print(f"SUMMARY providers: provision overhead {prov_us / base_us:.1f}x direct launch "
          f"({prov_us:.0f} us), 5-option failover {fo_us:.0f} us, onprem run round trip {med:.0f} ms median; "
          f"cloud job script build {script_us:.0f} us / parse {parse_us:.0f} us / sh run to report "
          f"{run_ms:.0f} ms median; sweep of 1,000 instances {sweep_ms:.1f} ms")


def cloud_jobs() -> tuple[float, float, float, float]:
    """(script build us, report parse us, median ms of running the script under sh to its report, ms of one
    sweep decision over 1,000 instances of which half are orphans)."""
    import shutil
    import subprocess
    from datetime import UTC, datetime, timedelta

    from broker.model import Capacity, InstanceType, Location, Offer
    from providers.base import TAG_JOB
    from providers.bootstrap import job_script, parse_report
    from providers.sweeper import find_orphans

    cmd = ("sh", "-c", "echo step; exit 3")
    script_us = per_call_us(lambda i: job_script(cmd, {"A": str(i)}, None, runtime_limit_seconds=3600), 2000)
    console = "boot noise\n" * 200 + "HB-LOG-TAIL=c3RlcAo=\nHB-EXIT-CODE=3\n"
    parse_us = per_call_us(lambda i: parse_report(console), 2000)
    print(f"cloud job script build:                {script_us:8.1f} us/call")
    print(f"console report parse (200-line console): {parse_us:6.1f} us/call")
    runs, lat = 20, []
    sh = shutil.which("sh") or "/bin/sh"
    with tempfile.TemporaryDirectory() as d:
        tty = Path(d) / "ttyS0"
        script = job_script(cmd, consoles=(str(tty),), poweroff=":", runtime_limit_seconds=60)
        for _ in range(runs):
            tty.write_text("")
            t = time.perf_counter()
            subprocess.run([sh, "-c", script], cwd=d, check=True, timeout=30, env={"PATH": "/usr/bin:/bin",
                                                                                   "TMPDIR": d})
            assert parse_report(tty.read_text()).exit_code == 3
            lat.append((time.perf_counter() - t) * 1000)
    run_ms = statistics.median(lat)
    print(f"job script under sh until its report:  median {run_ms:.1f} ms (n={runs})")

    class Cloud(FakeProvider):
        def orphans(self, active: set[str]) -> list:
            return []

    cloud = Cloud("fake")
    offer = Offer(InstanceType("m", 2, 8), Location("fake", "r1", None), Capacity.ON_DEMAND, 1.0)
    for i in range(1000):
        cloud.launch(offer, 1, f"j{i}-r0", tags={TAG_JOB: f"j{i}"})
    active = {f"j{i}" for i in range(0, 1000, 2)}
    later = datetime.now(UTC) + timedelta(days=1)
    t = time.perf_counter()
    reps = 20
    for _ in range(reps):
        found = find_orphans(cloud, active, later, 600)
    sweep_ms = (time.perf_counter() - t) / reps * 1000
    assert len(found) == 500
    print(f"sweeper decision, 1,000 instances:     {sweep_ms:8.2f} ms  ({len(found)} orphans)")
    return script_us, parse_us, run_ms, sweep_ms


if __name__ == "__main__":
    main()
