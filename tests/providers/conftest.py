"""Session fixtures for provider tests: moto in server mode, a fault proxy in front of it, a static HTTP
server for price-list fixtures, and a test CA for the HTTPS fakes."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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


def _serve_fake(module: Any, pki: Any, *args: Any) -> Iterator[Any]:
    """Serve one HTTPS fake (``fake_azure`` / ``fake_gcp``) for the session; its guests are cleaned up after."""
    app = module.make_app(*args)
    with module.ServerThread(app, pki.server_cert, pki.server_key) as srv:
        srv.app = app
        yield srv
    for guest in list(app.state.guests.values()):
        guest.cleanup()


@pytest.fixture(scope="session")
def azure_fake(pki):
    from . import fake_azure

    yield from _serve_fake(fake_azure, pki)


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


# -- GCP: a service-account key, the Compute Engine fake and a fault proxy in front of it (session-wide)

GCP_PROJECT = "demo-proj"


@pytest.fixture(scope="session")
def gcp_creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A service-account JSON key (a real RSA key) and a pre-seeded Libcloud token cache (RECIPES §4)."""
    import datetime as dt
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    d = tmp_path_factory.mktemp("gcp-creds")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    sa = {"type": "service_account", "project_id": GCP_PROJECT, "private_key_id": "k1", "private_key": pem,
          "client_email": f"hb-broker@{GCP_PROJECT}.iam.gserviceaccount.com", "client_id": "1",
          "token_uri": "https://oauth2.googleapis.com/token"}
    (d / "sa.json").write_text(json.dumps(sa))
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (d / "token.json").write_text(json.dumps({"access_token": "fake", "token_type": "Bearer",
                                              "expire_time": expires}))
    return {"key": str(d / "sa.json"), "token": str(d / "token.json"), "email": sa["client_email"]}


@pytest.fixture(scope="session")
def gcp_fake(pki) -> Iterator[Any]:
    from . import fake_gcp

    yield from _serve_fake(fake_gcp, pki, GCP_PROJECT)


@pytest.fixture(scope="session")
def gcp_proxy(gcp_fake, pki) -> Iterator[FaultProxy]:
    with FaultProxy(gcp_fake.url, certfile=pki.server_cert, keyfile=pki.server_key,
                    upstream_verify=pki.ca_cert) as proxy:
        # Reply without Nagle's delay: the handler writes headers and body separately, and each small write
        # otherwise waits ~40 ms for a delayed ACK (50 ms -> 13 ms per call here).
        proxy._server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
        yield proxy
