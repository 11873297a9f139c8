"""Benchmark of the GCP adapter (providers/gcp.py), all on 127.0.0.1.

1. Billing Catalog parsing: ``parse_billing_skus`` over a synthetic catalog the size of the real Compute
   Engine one (~30k SKUs: the fake's SKUs repeated over 40 regions, noise included), vs ``json.loads`` of
   the same document as the baseline in the same process.
2. Coverage of Libcloud's bundled GCE prices (``get_pricing("compute", "gce_instances")`` with the
   driver's own formula, family = first two letters of the name): which of the fake's machine types it
   cannot price right (n2d priced as n2, shared-core e2 billed as 2 vCPUs, GPU types without the GPU).
3. Lifecycle against the local HTTPS fake (real Libcloud GCE driver): ``offers()`` and one
   launch -> list -> terminate round trip, direct and through the fault proxy; n bounded.

Run: ``.venv/bin/python bench/gcp_bench.py`` from the repository root. Ends with one ``SUMMARY`` line.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402

from providers.gcp import GcpProvider, parse_billing_skus  # noqa: E402
from tests.providers.fake_gcp import MACHINE_TYPES, ServerThread, billing_skus, make_app  # noqa: E402
from tests.providers.faultproxy import FaultProxy  # noqa: E402
from tests.providers.tls import make_pki  # noqa: E402

N_ROUND_TRIPS = 15


def bench_parse() -> tuple[float, float, int]:
    base = billing_skus()
    skus = []
    for i in range(40):
        for s in base:
            skus.append(s | {"serviceRegions": [f"region-{i}"], "skuId": f"{s['skuId']}-{i}"})
    while len(skus) < 30_000:
        skus.extend(skus[: 30_000 - len(skus)])
    doc = json.dumps({"skus": skus})
    t0 = time.perf_counter()
    for _ in range(3):
        json.loads(doc)
    t_json = (time.perf_counter() - t0) / 3
    t0 = time.perf_counter()
    for _ in range(3):
        parse_billing_skus(skus)
    t_parse = (time.perf_counter() - t0) / 3
    return t_parse, t_json, len(skus)


def bench_accuracy() -> tuple[int, int, list[str]]:
    """Which of the fake's machine types Libcloud's bundled-price formula can price right at all: it takes the
    family from the first two letters, bills shared-core types as full vCPUs and never adds GPUs."""
    from libcloud.pricing import get_pricing

    lc = get_pricing(driver_type="compute", driver_name="gce_instances") or {}
    wrong: list[str] = []
    for name, (_, _, accs, shared) in MACHINE_TYPES.items():
        fam = name[:2]
        has_price = "us-central1" in (lc.get(fam, {}).get("cpu", {}).get("on_demand") or {})
        if not has_price or fam != name.split("-")[0] or shared or accs:
            wrong.append(name)
    return len(MACHINE_TYPES) - len(wrong), len(MACHINE_TYPES), wrong


def bench_lifecycle(tmp: Path) -> dict[str, float]:
    pki = make_pki(tmp / "pki")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    sa = {"type": "service_account", "project_id": "demo-proj", "private_key": pem,
          "client_email": "b@demo-proj.iam.gserviceaccount.com"}
    (tmp / "sa.json").write_text(json.dumps(sa))
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (tmp / "tok.json").write_text(json.dumps({"access_token": "x", "token_type": "Bearer", "expire_time": expires}))
    out: dict[str, float] = {}
    app = make_app("demo-proj", page_cap=500, sku_page_cap=5000)
    with ServerThread(app, pki.server_cert, pki.server_key) as srv, FaultProxy(
            srv.url, certfile=pki.server_cert, keyfile=pki.server_key, upstream_verify=pki.ca_cert) as proxy:
        proxy._server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
        for label, url in (("direct", srv.url), ("proxy", proxy.url)):
            gcp = GcpProvider("demo-proj", zones=["us-central1-a", "europe-west1-b"],
                              credentials_file=str(tmp / "sa.json"), endpoint=url, billing_url=url,
                              ca_bundle=pki.ca_cert, token_cache=str(tmp / "tok.json"), poll_interval_seconds=0)
            t0 = time.perf_counter()
            offers = gcp.offers()
            out[f"offers_{label}_ms"] = (time.perf_counter() - t0) * 1000
            offer = next(o for o in offers if o.instance_type.name == "n2-standard-4"
                         and o.region == "us-central1")
            times = []
            for _ in range(N_ROUND_TRIPS):
                req = f"bench-{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                made = gcp.launch(offer, 1, req, tags={"hb-job": "bench"})
                gcp.instances({"hb-request": req})
                gcp.terminate([i.id for i in made], req)
                times.append((time.perf_counter() - t0) * 1000)
            out[f"round_trip_{label}_ms"] = statistics.median(times)
            out[f"round_trip_{label}_p90_ms"] = sorted(times)[int(0.9 * (len(times) - 1))]
    return out


def main() -> None:
    t_parse, t_json, n = bench_parse()
    print(f"billing parse: {n} SKUs in {t_parse * 1000:.1f} ms ({n / t_parse:,.0f} SKUs/s); "
          f"json.loads of the same document {t_json * 1000:.1f} ms (parse = {t_parse / t_json:.2f}x json.loads)")
    ok, total, wrong = bench_accuracy()
    print(f"libcloud's bundled-price formula gets {ok} of {total} fake machine types right; wrong or None: "
          f"{', '.join(wrong)}")
    with tempfile.TemporaryDirectory() as d:
        lc = bench_lifecycle(Path(d))
    for k, v in lc.items():
        print(f"{k}: {v:.1f}")
    ratio = lc["round_trip_proxy_ms"] / lc["round_trip_direct_ms"]
    print(f"SUMMARY gcp: billing parse {n / t_parse:,.0f} SKUs/s ({t_parse / t_json:.2f}x json.loads); "
          f"launch+list+terminate {lc['round_trip_direct_ms']:.0f} ms median direct, "
          f"{lc['round_trip_proxy_ms']:.0f} ms via fault proxy ({ratio:.2f}x); offers() "
          f"{lc['offers_direct_ms']:.0f} ms; libcloud formula right for {ok}/{total} types")


if __name__ == "__main__":
    main()
