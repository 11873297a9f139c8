"""The agent's durable state: an SQLite outbox (uplink messages) and inbox (tasks).

Contracts:

* **Outbox.** Rows are kept in insertion order (``seq`` = rowid, AUTOINCREMENT: never reused). When a row
  is first published it gets its ``wire_seq``, the next number of the device's contiguous uplink sequence
  (0, 1, 2, ... persisted), so the gateway can tell a gap from a replay. Rows leave only when the gateway
  acknowledges their id (:meth:`Store.ack`). Results are never dropped. Droppable rows (telemetry) are
  capped at ``telemetry_cap``, oldest first, and only while unsent (a sent row holds a wire number).
  Ids are unique: putting an id twice keeps the first.
* **Inbox.** One row per task id; a task id is applied once (``add_task`` returns False for a known id,
  and a finished task keeps its outcome so the agent can refuse a re-dispatch and re-report it).
* Durability: WAL with ``synchronous=FULL``; writes are batched by the callers (``put_many``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Store", "OutRow", "TaskRow", "TASK_STATES"]

TASK_STATES = ("queued", "running", "succeeded", "failed", "refused", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  body TEXT NOT NULL,
  droppable INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  wire_seq INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_droppable ON outbox(droppable, seq);
CREATE TABLE IF NOT EXISTS inbox (
  task_id TEXT PRIMARY KEY,
  job_id TEXT NOT NULL,
  spec TEXT NOT NULL,
  expires_ms INTEGER,
  state TEXT NOT NULL,
  attempt INTEGER NOT NULL DEFAULT 0,
  exit_code INTEGER,
  received_ms INTEGER NOT NULL,
  finished_ms INTEGER
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class OutRow:
    seq: int
    id: str
    kind: str
    body: Mapping[str, Any]
    wire_seq: int | None = None


@dataclass(frozen=True, slots=True)
class TaskRow:
    task_id: str
    job_id: str
    spec: Mapping[str, Any]
    expires_ms: int | None
    state: str
    attempt: int
    exit_code: int | None


class Store:
    """Thread-safe (one connection, one lock) SQLite store at ``path``."""

    def __init__(self, path: str | Path, *, telemetry_cap: int = 1000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.telemetry_cap = telemetry_cap
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- outbox ---------------------------------------------------------------------------------
    def put(self, kind: str, body: Mapping[str, Any], *, id: str, droppable: bool = False) -> None:
        self.put_many([(kind, body, id, droppable)])

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any], str, bool]]) -> None:
        """Append ``(kind, body, id, droppable)`` rows in one transaction, then enforce the telemetry cap."""
        now = int(time.time() * 1000)
        rows = [(i, k, json.dumps(b, separators=(",", ":")), int(d), now) for k, b, i, d in items]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO outbox(id, kind, body, droppable, created_ms) VALUES (?,?,?,?,?)",
                    rows,
                )
                if any(r[3] for r in rows):
                    self._db.execute(
                        "DELETE FROM outbox WHERE droppable=1 AND wire_seq IS NULL AND seq NOT IN "
                        "(SELECT seq FROM outbox WHERE droppable=1 ORDER BY seq DESC LIMIT ?)",
                        (self.telemetry_cap,),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def pending(self, after_seq: int, limit: int) -> list[OutRow]:
        """Up to ``limit`` unacknowledged rows with ``seq > after_seq``, in seq order."""
        with self._lock:
            cur = self._db.execute(
                "SELECT seq, id, kind, body, wire_seq FROM outbox WHERE seq > ? ORDER BY seq LIMIT ?",
                (after_seq, limit),
            )
            return [OutRow(s, i, k, json.loads(b), w) for s, i, k, b, w in cur.fetchall()]

    def assign_wire_seqs(self, rows: Sequence[OutRow]) -> list[OutRow]:
        """Give rows without a wire number the next ones, in order, durably; returns the updated rows."""
        if all(r.wire_seq is not None for r in rows):
            return list(rows)
        out: list[OutRow] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT value FROM meta WHERE key='next_wire_seq'").fetchone()
                nxt = int(row[0]) if row else 0
                for r in rows:
                    if r.wire_seq is None:
                        self._db.execute("UPDATE outbox SET wire_seq=? WHERE seq=?", (nxt, r.seq))
                        r = OutRow(r.seq, r.id, r.kind, r.body, nxt)
                        nxt += 1
                    out.append(r)
                self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('next_wire_seq', ?)", (str(nxt),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return out

    def reset_wire_seqs(self) -> None:
        """Start the uplink sequence again at 0 (a new enrollment: the broker's device record is new)."""
        with self._lock:
            self._db.execute("UPDATE outbox SET wire_seq=NULL")
            self._db.execute("DELETE FROM meta WHERE key IN ('next_wire_seq', 'down_seq')")

    def ack(self, ids: Sequence[str]) -> int:
        """Delete acknowledged rows by id; returns how many were deleted (unknown ids are ignored)."""
        if not ids:
            return 0
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
            self._db.execute("COMMIT")
            return cur.rowcount

    def depth(self) -> dict[str, int]:
        with self._lock:
            total, dropp = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(droppable), 0) FROM outbox"
            ).fetchone()
        return {"outbox": int(total), "telemetry": int(dropp), "results": int(total) - int(dropp)}

    # ---- inbox ----------------------------------------------------------------------------------
    def add_task(self, task_id: str, job_id: str, spec: Mapping[str, Any], expires_ms: int | None,
                 state: str = "queued") -> bool:
        """Record a task; False when the task id is already known (nothing changes then)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO inbox(task_id, job_id, spec, expires_ms, state, received_ms) "
                "VALUES (?,?,?,?,?,?)",
                (task_id, job_id, json.dumps(spec), expires_ms, state, int(time.time() * 1000)),
            )
            return cur.rowcount == 1

    def task(self, task_id: str) -> TaskRow | None:
        with self._lock:
            row = self._db.execute(
                "SELECT task_id, job_id, spec, expires_ms, state, attempt, exit_code FROM inbox WHERE task_id=?",
                (task_id,),
            ).fetchone()
        return None if row is None else _task(row)

    def tasks(self, *states: str) -> list[TaskRow]:
        q = "SELECT task_id, job_id, spec, expires_ms, state, attempt, exit_code FROM inbox"
        args: tuple[str, ...] = ()
        if states:
            q += f" WHERE state IN ({','.join('?' * len(states))})"
            args = states
        with self._lock:
            return [_task(r) for r in self._db.execute(q + " ORDER BY received_ms, task_id", args).fetchall()]

    def set_task_state(self, task_id: str, state: str, *, exit_code: int | None = None,
                       bump_attempt: bool = False) -> None:
        fin = int(time.time() * 1000) if state in ("succeeded", "failed", "refused", "cancelled") else None
        with self._lock:
            self._db.execute(
                "UPDATE inbox SET state=?, exit_code=COALESCE(?, exit_code), finished_ms=COALESCE(?, finished_ms),"
                " attempt = attempt + ? WHERE task_id=?",
                (state, exit_code, fin, 1 if bump_attempt else 0, task_id),
            )

    # ---- meta -----------------------------------------------------------------------------------
    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?,?)", (key, value))


def _task(row: tuple[Any, ...]) -> TaskRow:
    return TaskRow(row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], row[6])
