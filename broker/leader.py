"""Scheduler leadership on a shared PostgreSQL: one leader at a time, and a fencing token on its writes.

Several ``broker serve`` replicas may share one PostgreSQL; only one of them may run scheduler cycles.

* **Lock.** The leader holds the session advisory lock :data:`broker.scheduler.LEADER_LOCK_ID` on a
  connection of its own (not from the pool). PostgreSQL drops the lock with the session: a database restart,
  ``pg_terminate_backend``, a network cut. :meth:`Leadership.check` runs at the start of every cycle and
  before every wave of launches (one launch by default, ``BROKER_SCHEDULER_LAUNCH_CONCURRENCY`` at most): it
  asks PostgreSQL, on that very connection, whether the lock is still held by this
  session. Any error or a missing lock ends the term (the connection is thrown away) and the replica tries to
  win the lock again on its next cycle.
* **Fencing token.** Winning the lock increments ``leader_epochs.epoch`` (row ``scheduler``) in the same
  session; the new value is the term's fencing token. Every scheduler write transaction starts with
  :meth:`Leadership.fence`: it takes the *shared* transaction-level advisory lock ``lock_id + 1`` and reads
  the epoch, and raises :class:`FencedOut` when the stored epoch is not this term's. A new leader increments
  the epoch while holding that lock *exclusively*, so the increment waits until every fenced transaction of
  the older term has ended, and any later transaction of the older term sees the new epoch and is rolled
  back. So no write of a deposed leader commits after its successor's term began, whatever the old process
  believes. (An advisory lock, unlike ``SELECT ... FOR SHARE``, writes nothing: the fence is one cheap
  round trip, see ``bench/leader_fencing.py``.)
* **Takeover.** A new term (:attr:`Leadership.new_term`) makes the scheduler reconcile again
  (:meth:`broker.scheduler.Scheduler.reconcile`): it re-reads on-prem runs from the shared data directory,
  adopts instances found by their ``hb-request`` tag, and leaves PROVISIONING jobs whose launch the previous
  leader may still be finishing alone for :data:`TAKEOVER_GRACE_SECONDS` before requeueing them.

On SQLite the store is one file of one process: that process always leads (epoch 0, fencing is a no-op).
Replicas sharing on-prem work must share the data directory (one machine) to adopt each other's runs; a
replica on another machine cannot see or adopt another machine's local runs, but a cancel or a logs request
through it works: it records the cancel for the replica that runs the job and serves the log tail that replica
stored (:mod:`broker.job_logs`).
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlmodel import Field, SQLModel

from broker.errors import BrokerError
from broker.store import Store, utc_column

__all__ = ["Leadership", "FencedOut", "LeaderEpochRow", "TAKEOVER_GRACE_SECONDS"]

log = logging.getLogger("broker.leader")

TAKEOVER_GRACE_SECONDS = 30.0  # how long a new leader waits for launches its predecessor may be finishing


class LeaderEpochRow(SQLModel, table=True):
    """The fencing token of a leadership (``name`` ``scheduler``): incremented by each new leader."""

    __tablename__ = "leader_epochs"
    name: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    epoch: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, default=0))
    holder: str = Field(default="", sa_column=sa.Column(sa.String(200), nullable=False, default=""))
    acquired_at: datetime = utc_column()


_epochs = LeaderEpochRow.__table__  # type: ignore[attr-defined]


class FencedOut(BrokerError):
    """A write of a leader whose term has ended (another replica leads now); the transaction is rolled back."""


class Leadership:
    """The leadership of ``name`` on ``store`` through advisory lock ``lock_id`` (see the module docstring)."""

    def __init__(self, store: Store, lock_id: int, name: str = "scheduler") -> None:
        self.store = store
        self.lock_id = lock_id
        self.name = name
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.epoch: int | None = 0 if not store.is_postgres else None
        self.new_term = not store.is_postgres  # set when a term starts; the scheduler clears it
        self.engaged = False  # True once check() ran: the scheduler loop leads through this object
        self._conn: sa.Connection | None = None
        self.backend_pid: int | None = None  # of the lock session (tests terminate it)

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    def check(self) -> bool:
        """True when this process leads now: the lock is still held by its session, else a new term is won."""
        self.engaged = True
        if not self.store.is_postgres:
            return True
        if self._conn is not None:
            return self.still_leads(thorough=True)
        return self._acquire()

    def still_leads(self, *, thorough: bool = False) -> bool:
        """True while the current term lasts (never wins a new term); True before :meth:`check` ever ran (a
        scheduler driven by hand). The lock lives as long as its session, so by default this asks the session
        to answer (``SELECT 1``, before every wave of launches); ``thorough`` (every cycle) asks ``pg_locks`` too."""
        if not self.store.is_postgres or not self.engaged:
            return True
        if self._conn is not None:
            try:
                held = self._conn.execute(
                    sa.text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                            "AND pid = pg_backend_pid() AND objsubid = 1 "
                            "AND ((classid::bigint << 32) | objid::bigint) = :k") if thorough
                    else sa.text("SELECT 1"),
                    {"k": self.lock_id},
                ).scalar()
                self._conn.commit()
            except sa.exc.SQLAlchemyError as exc:
                self._lost(f"its lock session failed ({type(exc).__name__})")
                return False
            if held:
                return True
            self._lost("its advisory lock is gone")
        return False

    def _acquire(self) -> bool:
        try:
            # autocommit: a lock check is one round trip (no BEGIN/COMMIT around it); the locks taken here are
            # session-level, so they do not depend on transactions
            conn = self.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        except sa.exc.SQLAlchemyError:
            return False
        try:
            got = conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.lock_id}).scalar()
            conn.commit()
            if not got:
                conn.close()
                return False
            # exclusive fence lock: waits for the fenced transactions of an older term to end (module docstring)
            conn.execute(sa.text("SELECT pg_advisory_lock(:f)"), {"f": self.lock_id + 1})
            stmt = postgresql.insert(_epochs).values(
                name=self.name, epoch=1, holder=self.holder, acquired_at=sa.func.now())
            epoch = conn.execute(
                stmt.on_conflict_do_update(index_elements=["name"], set_={
                    "epoch": _epochs.c.epoch + 1, "holder": self.holder, "acquired_at": sa.func.now()})
                .returning(_epochs.c.epoch)
            ).scalar_one()
            self.backend_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            conn.commit()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:f)"), {"f": self.lock_id + 1})
            conn.commit()
        except sa.exc.SQLAlchemyError as exc:
            log.warning("winning the scheduler leadership failed: %s", type(exc).__name__)
            conn.invalidate()
            conn.close()
            return False
        self._conn, self.epoch, self.new_term = conn, int(epoch), True
        log.info("this broker is the scheduler leader (epoch %d)", self.epoch)
        return True

    def _lost(self, why: str) -> None:
        log.warning("this broker is no longer the scheduler leader (epoch %s): %s", self.epoch, why)
        conn, self._conn, self.epoch, self.backend_pid = self._conn, None, None, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except sa.exc.SQLAlchemyError:
                pass

    def fence(self, session: Any) -> None:
        """Raise :class:`FencedOut` unless this term's epoch is the stored one (the fence lock is held shared
        until the transaction of ``session`` ends). A no-op on SQLite, and before :meth:`check` ever ran (a scheduler
        driven by hand, as tests and benchmarks do, is not a replica)."""
        if not self.store.is_postgres or not self.engaged:
            return
        mine = self.epoch
        stored = session.execute(
            sa.text("SELECT e.epoch FROM (SELECT pg_advisory_xact_lock_shared(:f)) AS fence, leader_epochs AS e "
                    "WHERE e.name = :n"),
            {"f": self.lock_id + 1, "n": self.name},
        ).scalar()
        if mine is None or stored != mine:
            raise FencedOut(f"scheduler write refused: this broker's leadership (epoch {mine}) ended; "
                            f"epoch {stored} leads now")

    def release(self) -> None:
        """Give the lock back (on shutdown)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.lock_id})
            conn.commit()
        except sa.exc.SQLAlchemyError:
            pass
        finally:
            conn.close()
            self.epoch = None
