"""Cost of scheduler leadership fencing on PostgreSQL (issue 17): the lock check and the fenced transaction.

Usage: .venv/bin/python bench/leader_fencing.py --store postgresql+psycopg://postgres@127.0.0.1:5432/<db> [--n 2000]

Migrates the database, wins the leadership, then times ``Leadership.still_leads()`` (the lock query on the
lock session, run every cycle and before every launch) and a one-statement write transaction with and without
``Leadership.fence`` (run at the start of every scheduler transaction). Last line:
``leader_fencing check_us=<median> tx_us=<median> fenced_tx_us=<median>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import sqlalchemy as sa

    from broker.leader import Leadership
    from broker.migrations import upgrade
    from broker.scheduler import LEADER_LOCK_ID
    from broker.store import Store

    ap = argparse.ArgumentParser()
    ap.add_argument("--store", required=True)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    store = Store(args.store)
    upgrade(store.engine)
    leader = Leadership(store, LEADER_LOCK_ID)
    assert leader.check(), "another process holds the leadership of this database"

    def timed(fn) -> float:  # noqa: ANN001
        out = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out) * 1e6

    def tx() -> None:  # the baseline: a write transaction with one statement
        with store.tx() as session:
            session.execute(sa.text("SELECT 1"))

    def fenced() -> None:  # the same with the fence as an extra statement
        with store.tx() as session:
            leader.fence(session)
            session.execute(sa.text("SELECT 1"))

    check_us, tx_us, fenced_us = timed(leader.still_leads), timed(tx), timed(fenced)
    leader.release()
    store.dispose()
    print(f"leader_fencing check_us={check_us:.0f} tx_us={tx_us:.0f} fenced_tx_us={fenced_us:.0f}")


if __name__ == "__main__":
    main()
