"""Session fixtures for provider tests: moto in server mode, a fault proxy in front of it, a static HTTP
server for price-list fixtures, and a test CA for the HTTPS fakes."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from .faultproxy import FaultProxy

FIXTURES = Path(__file__).with_name("fixtures")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def aws_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


@pytest.fixture
def ec2_faults(aws_proxy: FaultProxy) -> Iterator[FaultProxy]:
    aws_proxy.clear()
    yield aws_proxy
    aws_proxy.clear()


@pytest.fixture(scope="session")
def fixture_http() -> Iterator[str]:
    """A plain HTTP server on 127.0.0.1 serving ``tests/providers/fixtures``."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(FIXTURES)))
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def moto_reset(endpoint: str) -> None:
    httpx.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory):
    from .tls import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def azure_fake(pki):
    from .fake_azure import ServerThread, make_app

    app = make_app()
    with ServerThread(app, pki.server_cert, pki.server_key) as srv:
        srv.app = app  # type: ignore[attr-defined]
        yield srv
    for guest in list(app.state.guests.values()):
        guest.cleanup()


@pytest.fixture(scope="session")
def azure_proxy(azure_fake, pki) -> Iterator[FaultProxy]:
    with FaultProxy(azure_fake.url, certfile=pki.server_cert, keyfile=pki.server_key,
                    upstream_verify=pki.ca_cert) as proxy:
        yield proxy


@pytest.fixture
def arm_faults(azure_proxy: FaultProxy) -> Iterator[FaultProxy]:
    azure_proxy.clear()
    yield azure_proxy
    azure_proxy.clear()


class FakeCredential:
    """Anything with ``get_token`` is an Azure credential; the fake ARM does not check tokens."""

    def get_token(self, *scopes: str, **kwargs: object):
        import time

        from azure.core.credentials import AccessToken

        return AccessToken("fake-token", int(time.time()) + 3600)
