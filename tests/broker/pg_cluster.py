"""A private, throwaway PostgreSQL cluster on a free loopback port, for tests that stop or restart the
database (the shared server on 5432 is never touched). Needs root (initdb runs as ``postgres``)."""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.broker.service_support import free_port


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One private cluster for the session (tests restart or stop it; each uses its own database)."""
    pg = PgCluster()
    pg.start()
    try:
        yield pg
    finally:
        pg.destroy()


class PgCluster:
    """``start()``/``stop()``/``restart()`` a cluster in a temp dir; :attr:`url` is its SQLAlchemy URL."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("a private PostgreSQL cluster needs root, runuser and /usr/lib/postgresql/*/bin")
        self.bin = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="hb17-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        self._as_pg([str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres",
                     "-E", "UTF8", "--no-sync"])
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_pg(self, argv: list[str]) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
                " -c full_page_writes=off")  # a crash (stop -m immediate) keeps every commit: the OS has it
        self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"),
                     "-w", "-o", opts, "start"])

    def stop(self, mode: str = "immediate") -> None:
        self._as_pg([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", mode, "-w", "stop"])

    def restart(self) -> None:
        self.stop()
        self.start()

    def new_database(self) -> str:
        """A fresh database of the cluster; returns its SQLAlchemy URL."""
        name = f"hb_{secrets.token_hex(4)}"
        self.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def execute(self, sql: str) -> list[tuple]:
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True,
                             connect_timeout=3) as conn:
            cur = conn.execute(sql)
            return list(cur.fetchall()) if cur.description else []

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait_up(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
