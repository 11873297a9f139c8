"""`broker` CLI commands of the edge fleet: ``ca init``, ``devices enroll-token|list|revoke``, ``mqtt config``.

``ca init`` and ``devices ...`` go through the running broker's API (``BROKER_URL`` with the admin
``BROKER_TOKEN``, see :mod:`broker.client`), so they act on the server's CA and store wherever it runs.
``--local`` does the same on the local data directory and store instead (``BROKER_DATA_DIR``,
``BROKER_DATABASE_URL``; e.g. to create a CA offline before the first start). ``mqtt config`` writes files
from a CA directory on this machine (``--ca-dir``, default the local ``<data dir>/ca``).
Errors print one line on stderr and exit non-zero (see :mod:`broker.cli`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["register"]


def _settings() -> Any:
    from broker.config import load_settings

    return load_settings()


def _ca_dir(settings: Any, override: Path | None) -> Path:
    from broker.api_edge import ca_dir_of

    return override or ca_dir_of(settings)


def _store(settings: Any) -> Any:
    from broker.migrations import upgrade
    from broker.store import Store

    store = Store(settings.effective_database_url)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    upgrade(store.engine)
    return store


LocalOpt = Annotated[bool, typer.Option("--local", help="act on the local data dir and store, not the API")]


def _api(method: str, path: str, **kwargs: Any) -> Any:
    """One admin call to the running broker (``BROKER_URL``, ``BROKER_TOKEN``)."""
    from broker.client import BrokerClient

    with BrokerClient() as client:
        return client._json(method, path, **kwargs)


def ca_init(
    directory: Annotated[Path | None, typer.Option("--dir", help="with --local: CA directory (default "
                                                                "<data dir>/ca)")] = None,
    host: Annotated[list[str] | None, typer.Option("--host", help="extra SAN of the MQTT server cert")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing CA")] = False,
    local: LocalOpt = False,
) -> None:
    """Create the broker CA (EC P-256, key 0600), the gateway and Mosquitto server certificates, and a CRL."""
    from edge import pki

    if not local:
        if directory is not None:
            from broker.errors import SpecError

            raise SpecError("--dir", "only with --local (the broker keeps its CA in its own data directory)")
        out = _api("POST", "/v1/edge/ca", json={"hosts": list(host or ()), "force": force})
        typer.echo(f"CA created on the broker in {out['directory']} (ca.pem, ca.key 0600, gateway.pem/.key, "
                   "server.pem/.key, crl.pem)")
        return
    d = _ca_dir(_settings(), directory)
    try:
        pki.CertificateAuthority.init(d, server_hosts=("localhost", "127.0.0.1", *(host or ())), force=force)
    except pki.PkiError as exc:
        from broker.errors import ConflictError

        raise ConflictError(str(exc)) from None
    typer.echo(f"CA created in {d} (ca.pem, ca.key 0600, gateway.pem/.key, server.pem/.key, crl.pem)")


def parse_label_args(args: list[str], *, removals: bool) -> dict[str, str | None]:
    """``key=value`` sets, ``key-`` removes (when ``removals``), as ``kubectl label``; anything else is a
    :class:`SpecError` naming the argument. Keys and values are validated by the broker."""
    from broker.errors import SpecError

    out: dict[str, str | None] = {}
    for a in args:
        if "=" in a:
            k, _, v = a.partition("=")
            out[k] = v
        elif removals and a.endswith("-") and len(a) > 1:
            out[a[:-1]] = None
        else:
            raise SpecError(a, "not a label. To fix: write key=value" + (" (or key- to remove it)" if removals else ""))
    return out


def enroll_token(
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="namespace the device will belong to")],
    ttl: Annotated[float, typer.Option("--ttl", help="seconds the token stays valid", min=1)] = 3600,
    label: Annotated[list[str] | None, typer.Option("--label", "-l", help="key=value label of the device "
                                                                          "(repeatable)")] = None,
    local: LocalOpt = False,
) -> None:
    """Print a one-time enrollment token (only its hash is stored); the device it enrolls gets the labels."""
    from broker import devices
    from broker.clock import utcnow

    labels = parse_label_args(list(label or ()), removals=False)
    if not local:
        typer.echo(_api("POST", "/v1/edge/enroll-tokens", json={"namespace": namespace, "ttl_seconds": ttl,
                                                               "labels": labels})["token"])
        return
    from broker.tenants import DEFAULT_NAMESPACE, ensure_default_namespace

    store = _store(_settings())
    with store.tx() as s:
        if namespace == DEFAULT_NAMESPACE:  # `broker serve` makes it at its first start
            ensure_default_namespace(s, now=utcnow())
        token = devices.create_enroll_token(s, namespace, now=utcnow(), ttl_seconds=ttl, labels=labels)
    typer.echo(token)


def label_device(
    device_id: Annotated[str, typer.Argument(help="device id")],
    labels: Annotated[list[str], typer.Argument(help="key=value to set, key- to remove (as kubectl label)")],
    local: LocalOpt = False,
) -> None:
    """Set or remove a device's labels (jobs select devices with placement.nodeSelector)."""
    from broker import devices

    patch = parse_label_args(labels, removals=True)
    if not local:
        from urllib.parse import quote

        view = _api("PATCH", f"/v1/devices/{quote(device_id, safe='')}", json={"labels": patch})
    else:
        from broker.clock import utcnow

        store = _store(_settings())
        with store.tx() as s:
            view = devices.device_view(devices.label_device(s, device_id, patch), utcnow())
    shown = ", ".join(f"{k}={v}" for k, v in sorted(view["labels"].items())) or "none"
    typer.echo(f"{device_id} labels: {shown}")


def list_devices(
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    namespace: Annotated[str | None, typer.Option("--namespace", "-n")] = None,
    local: LocalOpt = False,
) -> None:
    """List enrolled devices: status, last seen, capacity, link quality, agent version, labels."""
    from broker import devices
    from broker.clock import utcnow

    if local:
        store = _store(_settings())
        now = utcnow()
        with store.read() as s:
            views = [devices.device_view(d, now) for d in devices.list_devices(s, namespace=namespace)]
    else:
        views = _api("GET", "/v1/devices", params={"namespace": namespace} if namespace else None)["devices"]
    if json_out:
        typer.echo(json.dumps({"devices": views}, indent=2))
        return
    if not views:
        typer.echo("no devices. Enroll one: broker devices enroll-token -n NS, then edge-agent enroll")
        return
    typer.echo(f"{'ID':<24} {'NAMESPACE':<12} {'STATUS':<8} {'CPU':>5} {'MEM GiB':>8} {'GPU':>3} {'ARCH':<6} "
               f"{'Mbit/s':>8} {'RTT ms':>7} {'AGENT':<8} {'LAST SEEN':<32} LABELS")
    for v in views:
        bw = "-" if v["bandwidth_mbps"] is None else f"{v['bandwidth_mbps']:.1f}"
        lat = "-" if v["latency_ms"] is None else f"{v['latency_ms']:.1f}"
        labels = ",".join(f"{k}={val}" for k, val in sorted((v.get("labels") or {}).items())) or "-"
        typer.echo(f"{v['id']:<24} {v['namespace']:<12} {v['status']:<8} {v['vcpus']:>5g} {v['memory_gib']:>8.1f} "
                   f"{v['gpus']:>3} {v['arch']:<6} {bw:>8} {lat:>7} {v['agent_version'] or '-':<8} "
                   f"{v['last_seen'] or '-':<32} {labels}")


def revoke(
    device_id: Annotated[str, typer.Argument(help="device id")],
    ca_dir: Annotated[Path | None, typer.Option("--ca-dir", help="with --local: CA directory (default "
                                                                 "<data dir>/ca)")] = None,
    local: LocalOpt = False,
) -> None:
    """Revoke a device: its certificates go on the CRL and the gateway drops its messages.

    Put the new CRL (``GET /v1/edge/crl``) into Mosquitto's certs/crl.pem and SIGHUP it."""
    from broker import devices
    from broker.clock import utcnow
    from edge import pki

    if not local:
        from urllib.parse import quote

        _api("POST", f"/v1/devices/{quote(device_id, safe='')}:revoke")
        typer.echo(f"revoked {device_id}; the broker's CRL is rewritten: fetch GET /v1/edge/crl into Mosquitto's "
                   "certs/crl.pem and SIGHUP it")
        return
    settings = _settings()
    d = _ca_dir(settings, ca_dir)
    ca = pki.CertificateAuthority.load(d) if (d / "ca.key").exists() else None
    store = _store(settings)
    with store.tx() as s:
        devices.revoke_device(s, ca, device_id, now=utcnow(), reason="revoked via CLI")
    typer.echo(f"revoked {device_id}" + (f"; CRL rewritten: {d / 'crl.pem'} (SIGHUP mosquitto)" if ca else
                                         "; no CA here, CRL not rewritten"))


def mqtt_config(
    out: Annotated[Path, typer.Option("--out", help="directory to write mosquitto.conf, acl, certs/ into")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535)] = 8883,
    bind: Annotated[str, typer.Option("--bind", help="listen address")] = "0.0.0.0",
    user: Annotated[str | None, typer.Option("--user", help="Mosquitto `user` (e.g. root for tests)")] = None,
    ca_dir: Annotated[Path | None, typer.Option("--ca-dir", help="CA directory (default <data dir>/ca)")] = None,
    dynsec_plugin: Annotated[str | None, typer.Option(
        "--dynsec-plugin", help="path of mosquitto_dynamic_security.so (default: found in the usual places)")] = None,
) -> None:
    """Write a production Mosquitto config: mTLS, CN as username, CRL, per-device access control in the
    dynamic-security plugin (kept in step with the registry by the gateway), persistence."""
    from broker.errors import NotFoundError
    from edge.mqttconf import MosquittoConfig, write_config

    d = _ca_dir(_settings(), ca_dir)
    if not (d / "server.pem").exists():
        raise NotFoundError(f"no CA in {d}. To fix: run `broker ca init` first")
    if dynsec_plugin is not None and not Path(dynsec_plugin).is_file():
        raise NotFoundError(f"--dynsec-plugin {dynsec_plugin}: no such file. To fix: pass the path of "
                            "mosquitto_dynamic_security.so (dpkg -L mosquitto | grep dynamic)")
    try:
        conf = write_config(out, ca_file=d / "ca.pem", cert_file=d / "server.pem", key_file=d / "server.key",
                            crl_file=d / "crl.pem", config=MosquittoConfig(port=port, bind_address=bind, user=user,
                                                                           dynsec_plugin=dynsec_plugin))
    except FileNotFoundError as exc:
        raise NotFoundError(str(exc)) from exc
    typer.echo(f"wrote {conf}; start with: mosquitto -c {conf}")


def register(app: typer.Typer) -> None:
    """Add ``ca``, ``devices`` and ``mqtt`` command groups to the root app."""
    ca = typer.Typer(help="the broker's certificate authority", no_args_is_help=True)
    ca.command("init")(ca_init)
    dev = typer.Typer(help="edge devices: enrollment tokens, registry, revocation", no_args_is_help=True)
    dev.command("enroll-token")(enroll_token)
    dev.command("list")(list_devices)
    dev.command("revoke")(revoke)
    dev.command("label")(label_device)
    mq = typer.Typer(help="the MQTT broker (Mosquitto) of the edge fleet", no_args_is_help=True)
    mq.command("config")(mqtt_config)
    app.add_typer(ca, name="ca")
    app.add_typer(dev, name="devices")
    app.add_typer(mq, name="mqtt")
