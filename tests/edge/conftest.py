"""Fixtures of the edge tests: a CA, a real Mosquitto with the generated production config, a SQLite
store with the edge tables, the edge API on a real uvicorn server, a gateway, and enrolled agents."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge import pki
from edge.mqttconf import MosquittoConfig, write_config

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.01)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def wait_until(cond: Any, timeout: float, what: str, step: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Mosquitto:
    """A real mosquitto started from exactly the config ``broker mqtt config`` generates."""

    def __init__(self, directory: Path, ca_dir: Path) -> None:
        self.dir = directory
        self.port = free_port()
        user = "root" if os.geteuid() == 0 else None
        self.conf = write_config(directory, ca_file=ca_dir / "ca.pem", cert_file=ca_dir / "server.pem",
                                 key_file=ca_dir / "server.key", crl_file=ca_dir / "crl.pem",
                                 config=MosquittoConfig(port=self.port, bind_address="127.0.0.1", user=user))
        self.ca_dir = ca_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = directory / "mosquitto.log"

    def start(self) -> None:
        assert MOSQUITTO
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "ab"))  # noqa: SIM115
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload_crl(self) -> None:
        """Copy the CA's crl.pem into the broker's certs/ and SIGHUP it (what an operator does)."""
        shutil.copyfile(self.ca_dir / "crl.pem", self.dir / "certs" / "crl.pem")
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)


@pytest.fixture(scope="session")
def ca(tmp_path_factory: pytest.TempPathFactory) -> pki.CertificateAuthority:
    return pki.CertificateAuthority.init(tmp_path_factory.mktemp("ca"))


@pytest.fixture()
def fresh_ca(tmp_path: Path) -> pki.CertificateAuthority:
    return pki.CertificateAuthority.init(tmp_path / "ca")


@pytest.fixture()
def mosquitto(tmp_path: Path, fresh_ca: pki.CertificateAuthority) -> Iterator[Mosquitto]:
    if MOSQUITTO is None:
        pytest.skip("mosquitto is not installed (apt-get install -y mosquitto)")
    m = Mosquitto(tmp_path / "mqtt", fresh_ca.directory)
    m.start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[Any]:
    from broker.migrations import upgrade
    from broker.store import Store

    s = Store(f"sqlite:///{tmp_path / 'broker.db'}")
    upgrade(s.engine)
    try:
        yield s
    finally:
        s.dispose()


class ApiServer:
    def __init__(self, url: str, settings: Any) -> None:
        self.url = url
        self.settings = settings


@pytest.fixture()
def edge_api(store: Any, fresh_ca: pki.CertificateAuthority, tmp_path: Path) -> Iterator[ApiServer]:
    """The edge router in a tiny app on a real uvicorn server (admin = bearer ``admin-token``)."""
    import uvicorn
    from fastapi import FastAPI, Header, HTTPException

    import broker.api_deps as deps
    from broker import api_edge
    from broker.clock import SystemClock
    from broker.config import Settings

    settings = Settings(data_dir=tmp_path, ca_key_file=fresh_ca.directory / "ca.key",
                        mqtt_url="mqtts://127.0.0.1:1")
    app = FastAPI()
    app.include_router(api_edge.router)

    def session() -> Iterator[Any]:
        with store.read() as s:
            yield s

    def admin(authorization: str = Header(default="")) -> str:
        if authorization != "Bearer admin-token":
            raise HTTPException(status_code=403, detail="admin only")
        return "admin"

    app.dependency_overrides[deps.get_settings] = lambda: settings
    app.dependency_overrides[deps.get_session] = session
    app.dependency_overrides[deps.get_clock] = SystemClock
    app.dependency_overrides[deps.require_admin] = admin
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="off"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    wait_until(lambda: server.started, 10, "uvicorn to start")
    try:
        yield ApiServer(f"http://127.0.0.1:{port}", settings)
    finally:
        server.should_exit = True
        th.join(10)


def make_gateway(store: Any, mosquitto: Mosquitto, ca: pki.CertificateAuthority, **kw: Any) -> Any:
    from broker.gateway import Gateway

    gw = Gateway(store, host="127.0.0.1", port=mosquitto.port, ca_file=str(ca.directory / "ca.pem"),
                 cert_file=str(ca.directory / "gateway.pem"), key_file=str(ca.directory / "gateway.key"), **kw)
    gw.start()
    return gw


def new_token(store: Any, namespace: str = "team-a", ttl_s: float = 600) -> str:
    from broker import devices
    from broker.clock import utcnow
    from broker.tenants import NamespaceRow, namespace_exists

    with store.tx() as s:
        if not namespace_exists(s, namespace):  # an enrollment token needs its namespace
            s.add(NamespaceRow(name=namespace, created_at=utcnow()))
            s.flush()
        return devices.create_enroll_token(s, namespace, now=utcnow(), ttl_seconds=ttl_s)


def enroll_agent(state_dir: Path, api: ApiServer, store: Any, mosquitto: Mosquitto, device_id: str,
                 **cfg: Any) -> Any:
    """Enroll through the real HTTP API and point the agent at the test Mosquitto."""
    import dataclasses

    from edge.agent.enroll import enroll

    c = enroll(api.url, new_token(store), state_dir, device_id=device_id, mqtt=f"127.0.0.1:{mosquitto.port}")
    cfg.setdefault("heartbeat_seconds", 2.0)
    cfg.setdefault("retransmit_seconds", 2.0)
    cfg.setdefault("reconnect_max_seconds", 1)
    cfg.setdefault("task_user", "")  # tasks here run the test's interpreter, which the task user cannot reach
    c = dataclasses.replace(c, **cfg)
    c.save()
    return c


class AgentProcess:
    """``edge-agent run`` as a real process (so it can be SIGKILLed)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([sys.executable, "-m", "edge.agent.cli", "--state-dir", str(self.state_dir),
                                      "run"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.state_dir / "agent.log", "ab"))  # noqa: SIM115

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


TASK_USER = "hb-task-test"


@pytest.fixture(scope="session")
def task_user() -> str:
    """An unprivileged account for tasks (what ``edge-agent install`` creates); needs root."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("running tasks as another user needs root")
    try:
        pwd.getpwnam(TASK_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TASK_USER],
                       check=True, capture_output=True)
    return TASK_USER


@pytest.fixture()
def task_root() -> Iterator[Path]:
    """A task work root the task user can reach (pytest's tmp_path is 0700 root)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="hb-tasks-"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
