"""The durable store: SQLModel tables and the engine factory, the same code on SQLite (WAL) and PostgreSQL.

The store is the truth of the broker: namespaces, API tokens (hashes only), jobs, one event row per job
state change, provisioning attempts, labels and idempotency keys. Nothing that matters lives only in memory,
so several broker processes can share one PostgreSQL.

Times are stored as UTC and always read back timezone-aware (:class:`UTCDateTime`).

Design choice: on SQLite every write transaction of this process goes through one lock
(:meth:`Store.tx`). SQLite has a single writer anyway; serialising in-process avoids the busy-handler's
sleeps (up to 100 ms each) that concurrent writers would otherwise hit. PostgreSQL runs writers in
parallel and claims work with ``SELECT ... FOR UPDATE SKIP LOCKED``.

Small writes of the request path (job submissions) go through :class:`GroupCommitter`: one writer thread
runs the writes queued meanwhile in one shared transaction (group commit), so a commit, a lock hand-off
and a priority-class read are paid once per batch instead of once per request.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import StaticPool
from sqlmodel import Field, Session, SQLModel

__all__ = [
    "UTCDateTime",
    "NamespaceRow",
    "TokenRow",
    "JobRow",
    "JobLabelRow",
    "JobLogTailRow",
    "JobEventRow",
    "AttemptRow",
    "IdempotencyRow",
    "Store",
    "GroupCommitter",
    "make_engine",
    "new_job_id",
    "utc",
]

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp stored as UTC and returned timezone-aware (SQLite keeps no zone; PostgreSQL timestamptz)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        value = utc(value)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        return None if value is None else utc(value)


def utc(value: datetime) -> datetime:
    """``value`` as timezone-aware UTC (naive values are taken as UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utc_column(nullable: bool = False, index: bool = False) -> Any:
    """A SQLModel field stored as a timezone-aware UTC timestamp (every table of the broker uses this)."""
    return Field(default=None, sa_column=sa.Column(UTCDateTime(), nullable=nullable, index=index))


class NamespaceRow(SQLModel, table=True):
    """A tenant. Jobs and namespace tokens belong to exactly one namespace."""

    __tablename__ = "namespaces"
    name: str = Field(sa_column=sa.Column(sa.String(63), primary_key=True))
    created_at: datetime = utc_column()


class TokenRow(SQLModel, table=True):
    """An API token. ``namespace`` None is an admin token. Only the SHA-256 of the secret is stored."""

    __tablename__ = "tokens"
    id: str = Field(sa_column=sa.Column(sa.String(32), primary_key=True))
    namespace: str | None = Field(
        default=None,
        sa_column=sa.Column(sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE"), index=True),
    )
    token_hash: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, unique=True))
    description: str = Field(default="", sa_column=sa.Column(sa.String(200), nullable=False, default=""))
    created_at: datetime = utc_column()
    revoked_at: datetime | None = utc_column(nullable=True)


class JobRow(SQLModel, table=True):
    """One job. ``id`` sorts in submission order; ``spec_json`` is :func:`broker.spec.spec_to_dict` as JSON.

    ``not_before`` holds a job in BACKOFF (or PENDING) until that time. ``placement_json`` is the chosen
    OPTION object of ``broker place --json``; ``instances_json`` the provider's instance ids of the current
    run. ``vcpus``/``memory_gib``/``gpus`` are per node times ``nodes`` (what on-prem capacity accounting reads).
    """

    __tablename__ = "jobs"
    __table_args__ = (sa.Index("ix_jobs_queue", "state", "priority", "id"),)
    id: str = Field(sa_column=sa.Column(sa.String(40), primary_key=True))
    namespace: str = Field(
        sa_column=sa.Column(
            sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    name: str = Field(sa_column=sa.Column(sa.String(253), nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False, index=True))
    priority: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    created_at: datetime = utc_column()
    updated_at: datetime = utc_column()
    not_before: datetime | None = utc_column(nullable=True)
    started_at: datetime | None = utc_column(nullable=True)
    finished_at: datetime | None = utc_column(nullable=True)
    vcpus: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    memory_gib: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    gpus: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    spec_json: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    placement_json: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    provider: str | None = Field(default=None, sa_column=sa.Column(sa.String(32), index=True))
    region: str | None = Field(default=None, sa_column=sa.Column(sa.String(64)))
    dry_run: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))
    instances_json: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    request_id: str | None = Field(default=None, sa_column=sa.Column(sa.String(64)))
    retries: int = Field(default=0, sa_column=sa.Column(sa.Integer, nullable=False, default=0))
    held_reason: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    message: str | None = Field(default=None, sa_column=sa.Column(sa.Text))
    exit_code: int | None = Field(default=None, sa_column=sa.Column(sa.Integer))
    # a cancel asked through a replica that cannot stop the run itself; the replica that can carries it out
    cancel_requested_at: datetime | None = utc_column(nullable=True)


class JobLogTailRow(SQLModel, table=True):
    """The last bytes of one stream (``stdout``/``stderr``) of a job's current on-prem run, stored by the replica
    that runs it (while it runs, and when it ends) so every replica can serve the job's logs.
    ``size_bytes`` is the stream's whole size when stored; ``ended`` says the run had ended."""

    __tablename__ = "job_log_tails"
    job_id: str = Field(
        sa_column=sa.Column(sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    )
    stream: str = Field(sa_column=sa.Column(sa.String(8), primary_key=True))
    instance_id: str = Field(sa_column=sa.Column(sa.String(200), nullable=False))
    data: bytes = Field(sa_column=sa.Column(sa.LargeBinary, nullable=False))
    size_bytes: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, default=0))
    ended: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))
    stored_at: datetime = utc_column()


class JobLabelRow(SQLModel, table=True):
    """One ``metadata.labels`` entry of a job, so label selectors run in SQL."""

    __tablename__ = "job_labels"
    __table_args__ = (sa.Index("ix_job_labels_kv", "key", "value"),)
    job_id: str = Field(
        sa_column=sa.Column(sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    )
    key: str = Field(sa_column=sa.Column(sa.String(317), primary_key=True))
    value: str = Field(sa_column=sa.Column(sa.String(63), nullable=False))


class JobEventRow(SQLModel, table=True):
    """One state change of a job (``from_state`` None for the submission), written in the same transaction
    as the change itself. ``from_state == to_state`` records a note without a change (e.g. a hold)."""

    __tablename__ = "job_events"
    id: int | None = Field(default=None, sa_column=sa.Column(_BigId, primary_key=True, autoincrement=True))
    job_id: str = Field(
        sa_column=sa.Column(
            sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    at: datetime = utc_column()
    from_state: str | None = Field(default=None, sa_column=sa.Column(sa.String(16)))
    to_state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    reason: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, default=""))
    data_json: str | None = Field(default=None, sa_column=sa.Column(sa.Text))


class AttemptRow(SQLModel, table=True):
    """One provisioning attempt of a job (:class:`broker.model.Attempt` as stored)."""

    __tablename__ = "attempts"
    id: int | None = Field(default=None, sa_column=sa.Column(_BigId, primary_key=True, autoincrement=True))
    job_id: str = Field(
        sa_column=sa.Column(
            sa.String(40), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    at: datetime = utc_column()
    request_id: str = Field(default="", sa_column=sa.Column(sa.String(64), nullable=False, default=""))
    provider: str = Field(sa_column=sa.Column(sa.String(32), nullable=False))
    region: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    instance_type: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    capacity: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    outcome: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    message: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, default=""))
    delay_seconds: float = Field(default=0.0, sa_column=sa.Column(sa.Float, nullable=False, default=0.0))
    retryable: bool = Field(default=False, sa_column=sa.Column(sa.Boolean, nullable=False, default=False))


class IdempotencyRow(SQLModel, table=True):
    """The first response to a request carrying an ``Idempotency-Key``, replayed for any retry of it."""

    __tablename__ = "idempotency_keys"
    namespace: str = Field(
        sa_column=sa.Column(
            sa.String(63), sa.ForeignKey("namespaces.name", ondelete="CASCADE"), primary_key=True
        )
    )
    key: str = Field(sa_column=sa.Column(sa.String(255), primary_key=True))
    request_sha256: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    status_code: int = Field(sa_column=sa.Column(sa.Integer, nullable=False))
    response_json: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    created_at: datetime = utc_column()


STATEMENT_TIMEOUT_MS = 30_000  # no statement of the broker runs longer (a tenant cannot pin a core)


def make_engine(url: str, statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> Engine:
    """An engine for ``url``: SQLite files get WAL, ``synchronous=NORMAL``, foreign keys and a busy timeout;
    ``sqlite://`` (memory) shares one connection; PostgreSQL gets ``pool_pre_ping``.

    Every statement is bounded by ``statement_timeout_ms``: PostgreSQL's ``statement_timeout`` is set on each
    new session (the server cancels it, SQLSTATE 57014); SQLite gets a progress handler that interrupts a
    statement running past its deadline (``sqlite3.OperationalError: interrupted``)."""
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False},
            poolclass=StaticPool if memory else None,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=10000"):
                cur.execute(f"PRAGMA {pragma}")
            cur.close()
            deadline = [float("inf")]
            _record.info["hb_deadline"] = deadline
            dbapi_conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline[0] else 0, 10_000)

        @event.listens_for(engine, "before_cursor_execute")
        def _start_clock(conn: Any, *_args: Any) -> None:
            deadline = conn.info.get("hb_deadline")
            if deadline is not None:
                deadline[0] = time.monotonic() + statement_timeout_ms / 1000.0

        @event.listens_for(engine, "commit")
        @event.listens_for(engine, "rollback")
        def _stop_clock(conn: Any) -> None:
            deadline = conn.info.get("hb_deadline")
            if deadline is not None:
                deadline[0] = float("inf")

        return engine
    engine = sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10)

    @event.listens_for(engine, "connect")
    def _timeout(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET statement_timeout = {int(statement_timeout_ms)}")
        dbapi_conn.commit()

    return engine


_id_lock = threading.Lock()
_last_id_ns = 0


def new_job_id() -> str:
    """A new job id: ``j`` + 16 hex digits of a strictly increasing nanosecond stamp + 6 random hex digits.

    Ids sort in creation order within a process (FIFO tie-break) and are unique across processes.
    """
    import secrets

    global _last_id_ns
    with _id_lock:
        now = max(time.time_ns(), _last_id_ns + 1)
        _last_id_ns = now
    return f"j{now:016x}{secrets.token_hex(3)}"


class Store:
    """The engine plus the transaction discipline of the broker (see the module's design choice).

    ``tx()`` is a write transaction (committed on exit, rolled back on error); ``read()`` a session for
    queries. On PostgreSQL :attr:`is_postgres` enables row locks and advisory locks.
    """

    def __init__(self, url: str, engine: Engine | None = None, *,
                 statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> None:
        self.url = url
        self.engine = engine or make_engine(url, statement_timeout_ms)
        self.dialect = self.engine.dialect.name
        self.is_sqlite = self.dialect == "sqlite"
        self.is_postgres = self.dialect == "postgresql"
        self._write_lock = threading.RLock() if self.is_sqlite else None

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """A write transaction; on SQLite it runs under the process write lock (one writer at a time)."""
        if self._write_lock is not None:
            with self._write_lock, Session(self.engine, expire_on_commit=False) as session:
                try:
                    yield session
                    session.commit()
                except BaseException:
                    session.rollback()
                    raise
        else:
            with Session(self.engine, expire_on_commit=False) as session:
                try:
                    yield session
                    session.commit()
                except BaseException:
                    session.rollback()
                    raise

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads (no commit)."""
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    def ping(self) -> bool:
        """True when the database answers ``SELECT 1``."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False

    def dispose(self) -> None:
        self.engine.dispose()


ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
_log = logging.getLogger("broker.store")
_STOP = object()

WriteBatch = Callable[[Session, list[ItemT]], list[ResultT | BaseException]]


class GroupCommitter(Generic[ItemT, ResultT]):
    """A single writer thread that stores queued items in shared transactions (group commit).

    :meth:`submit` queues an item and returns a :class:`concurrent.futures.Future`. The writer takes what
    is queued (at most ``max_batch`` items) and calls ``write_batch(session, items)`` in ONE
    :meth:`Store.tx`, which returns one outcome per item, in order: a result, or an exception instance
    for an item refused on its own (its writes must then not have been made). Futures are resolved only
    after the commit, so a result that reached a caller is durable. When ``write_batch`` raises, or the
    commit fails, the batch is rolled back and each item is written again alone (``[item]``) in its own
    transaction, so one item's failure (e.g. a unique key taken meanwhile) never affects another, and a
    raised exception goes to that item's future. Hence ``write_batch`` must touch the store only through
    ``session`` and be safe to run again after a rollback.

    A batch holds items of total ``weight`` (default 1 per item) up to ``max_batch``, and always at least
    one item. The thread starts on the first :meth:`submit` and exits after ``idle_seconds`` without work (or on
    :meth:`close`); a later submit starts a new one, so an app that is never shut down leaks no thread.
    """

    def __init__(self, store: Store, write_batch: WriteBatch[ItemT, ResultT], *, max_batch: int = 64,
                 weight: Callable[[ItemT], int] | None = None, idle_seconds: float = 2.0,
                 name: str = "hb-writer") -> None:
        self.store = store
        self.write_batch = write_batch
        self.max_batch = max_batch
        self.weight = weight or (lambda _item: 1)
        self._carry: Any = None  # the entry that did not fit in the previous batch
        self.idle_seconds = idle_seconds
        self.name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions committed (for benchmarks and tests)
        self.items = 0  # items resolved by those transactions

    def submit(self, item: ItemT) -> Future[ResultT]:
        """Queue ``item`` for the writer; its future gets the item's result or exception."""
        future: Future[ResultT] = Future()
        weight = self.weight(item)  # in the caller's thread: an error here is the caller's
        with self._lock:
            self._queue.put((item, future, weight))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return future

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued and stop the writer thread (a later :meth:`submit` starts it again)."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return
            self._queue.put(_STOP)
        thread.join(timeout)

    def _next(self, block: bool) -> Any:
        if self._carry is not None:
            entry, self._carry = self._carry, None
            return entry
        return self._queue.get(timeout=self.idle_seconds) if block else self._queue.get_nowait()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # a bug: log it, and let a new writer take over what is queued
            _log.exception("the writer thread %s failed", self.name)
            with self._lock:
                self._thread = None
                if not self._queue.empty() or self._carry is not None:
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                    self._thread.start()
            raise

    def _loop(self) -> None:
        while True:
            try:
                first = self._next(block=True)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            batch: list[tuple[ItemT, Future[ResultT]]] = []
            total = 0
            stop = first is _STOP
            if not stop:
                batch.append(first[:2])
                total = first[2]
            while total < self.max_batch and not stop:
                try:
                    entry = self._next(block=False)
                except queue.Empty:
                    break
                if entry is _STOP:
                    stop = True
                    break
                if total + entry[2] > self.max_batch:
                    self._carry = entry
                    break
                batch.append(entry[:2])
                total += entry[2]
            live = [(item, f) for item, f in batch if f.set_running_or_notify_cancel()]
            if live:
                self._write(live)
            if stop:
                with self._lock:
                    if self._queue.empty() and self._carry is None:
                        self._thread = None
                        return
                    self._queue.put(_STOP)  # write what came meanwhile first

    def _write(self, batch: list[tuple[ItemT, Future[ResultT]]]) -> None:
        try:
            with self.store.tx() as session:
                outcomes = self.write_batch(session, [item for item, _ in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"write_batch returned {len(outcomes)} outcomes for {len(batch)} items")
        except BaseException as exc:  # noqa: BLE001 - handed to the futures, or every item is re-run alone
            if len(batch) == 1:
                batch[0][1].set_exception(exc)
                return
            _log.debug("group commit of %d items failed (%s); writing them one by one", len(batch), exc)
            for entry in batch:
                self._write([entry])
            return
        self.batches += 1
        self.items += len(batch)
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
