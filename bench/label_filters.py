"""How fast a job listing with 1000 ``label=`` filters is refused (issue 17: a tenant cannot pin a core).

Usage: .venv/bin/python bench/label_filters.py [--store URL] [--requests 20]

A broker app on a fresh SQLite file (or ``--store``, e.g. a PostgreSQL database) under a real uvicorn on
127.0.0.1; each request lists jobs with 1000 label filters and must answer 422. Last line:
``label_filters_1000 store=<dialect> status=422 median_ms=<x> max_ms=<x>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import httpx

    from tests.broker.service_support import ADMIN_H, make_app, serve_in_thread

    ap = argparse.ArgumentParser()
    ap.add_argument("--store", default=None)
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hb-labels-"))
    app = make_app(tmp, args.store or f"sqlite:///{tmp / 'broker.db'}")
    params = [("label", f"k{i}=v") for i in range(1000)]
    with serve_in_thread(app) as base, httpx.Client(base_url=base, headers=ADMIN_H, timeout=60) as client:
        client.get("/v1/namespaces/default/jobs")
        took = []
        for _ in range(args.requests):
            t0 = time.perf_counter()
            r = client.get("/v1/namespaces/default/jobs", params=params)
            took.append(time.perf_counter() - t0)
            assert r.status_code == 422, r.text
    print(f"label_filters_1000 store={app.state.hb.store.dialect} status=422 "
          f"median_ms={statistics.median(took) * 1000:.1f} max_ms={max(took) * 1000:.1f}")


if __name__ == "__main__":
    main()
