"""Edge jobs through the broker's scheduler: placing and dispatching N jobs onto enrolled devices, and
applying their outcomes, against the same scheduler placing the same jobs on a cloud provider that accepts
instantly (the baseline, same process). Ends with one summary line.

The gateway is built from a real CA but not connected: each dispatch writes its task row and signs and
queues its downlink as in production, minus the network (bench/edge.py measures Mosquitto itself).

    .venv/bin/python bench/edge_service.py [--jobs 1000] [--devices 50] [--database-url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker import devices  # noqa: E402
from broker.lifecycle import submit_jobs  # noqa: E402
from broker.spec import parse_job_spec  # noqa: E402
from edge import pki  # noqa: E402
from providers.fake import FakeProvider  # noqa: E402
from tests.broker.service_support import catalog, job_doc, make_settings  # noqa: E402


def _app(tmp: Path, url: str, edge: bool) -> Any:
    import pricing
    from broker.app import create_app

    extra: dict[str, Any] = {}
    if edge:
        pki.CertificateAuthority.init(tmp / "data" / "ca")
        extra["mqtt_url"] = "mqtts://127.0.0.1:1"
    settings = make_settings(tmp, url, **extra)
    egress = pricing.load_egress(None, sites=pricing.load_inventory(settings.inventory).sites)
    return create_app(settings, providers={"aws": FakeProvider("aws")}, catalog=catalog(), egress=egress)


def _run(hb: Any, n: int, providers: list[str]) -> tuple[float, int]:
    now = hb.clock.now()
    specs = [parse_job_spec(job_doc(f"e-{i}", cpu=str(1 + i % 2), providers=providers), now=now) for i in range(n)]
    with hb.store.tx() as session:
        submit_jobs(session, "default", specs, now=now, spec_docs=[json.dumps(s.raw) for s in specs])
    t0 = time.perf_counter()
    dispatched = 0
    while dispatched < n:
        report = hb.scheduler.run_cycle()
        dispatched += report.provisioned
        if not report.heads:
            break
    return time.perf_counter() - t0, dispatched


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--database-url", default="")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_cloud, tempfile.TemporaryDirectory() as tmp_edge:
        base = _app(Path(tmp_cloud), args.database_url or f"sqlite:///{tmp_cloud}/b.db", edge=False).state.hb
        kind = "postgresql" if base.store.is_postgres else "sqlite"
        cloud_s, cloud_n = _run(base, args.jobs, ["aws"])
        base.store.dispose()

        hb = _app(Path(tmp_edge), args.database_url or f"sqlite:///{tmp_edge}/e.db", edge=True).state.hb
        now = hb.clock.now()
        with hb.store.tx() as s:
            for i in range(args.devices):
                s.add(devices.EdgeDeviceRow(
                    id=f"dev-{i:03d}", namespace="default", cert_pem="-", cert_serial=f"s{i}",
                    cert_not_after=now + timedelta(days=1), enrolled_at=now, last_seen=now, online=True,
                    vcpus=4, memory_gib=8, arch="amd64", bandwidth_mbps=50.0 + i, hourly_usd=0.001 * (i % 7)))
        edge_s, edge_n = _run(hb, args.jobs, ["edge"])
        # every device reports success; the scheduler's poll step applies the outcomes from the store
        with hb.store.tx() as s:
            s.execute(devices.EdgeTaskRow.__table__.update().values(state="succeeded", exit_code=0))  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        settled = hb.scheduler.run_cycle().finished
        settle_s = time.perf_counter() - t0
        hb.store.dispose()
    cloud_rate, edge_rate, settle_rate = cloud_n / cloud_s, edge_n / edge_s, settled / settle_s
    print(f"[{kind}] cloud baseline: {cloud_n} jobs placed+dispatched in {cloud_s:.2f}s = {cloud_rate:.0f} jobs/s")
    print(f"[{kind}] edge, {args.devices} devices: {edge_n} jobs placed+dispatched (task row + signed downlink) "
          f"in {edge_s:.2f}s = {edge_rate:.0f} jobs/s")
    print(f"[{kind}] edge outcomes applied by the poll sweep: {settled} in {settle_s:.2f}s = {settle_rate:.0f}/s")
    print(f"SUMMARY edge_service[{kind}]: {edge_rate:.0f} edge jobs/s dispatched "
          f"({edge_rate / cloud_rate:.2f}x the cloud baseline), {settle_rate:.0f} outcomes/s applied")


if __name__ == "__main__":
    main()
