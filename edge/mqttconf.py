"""The production Mosquitto configuration of the edge fleet (``broker mqtt config --out DIR``).

What it enforces: TLS only, a client certificate is required and its CN becomes the username
(``use_identity_as_username``), the CRL is checked (``crlfile``), and access control is Mosquitto's
bundled **dynamic-security plugin** (``mosquitto_dynamic_security.so``): every client gets nothing by
default (publish, receive and subscribe all denied), the gateway identity may use every device's topics
(shared subscriptions included) and administer the plugin (``$CONTROL/dynamic-security/v1``), and each
enrolled device gets a client (username = its certificate CN) with a role of its own that lets it publish
to ``hb/v1/dev/<id>/up/#`` and subscribe to and receive ``hb/v1/dev/<id>/down/#``, nothing else.
The gateway keeps the plugin's clients in step with the device registry (:class:`broker.gateway.Gateway`,
``sync_acl``): enrolled devices are added, revoked ones deleted (which also disconnects them).

Why the plugin and not an ``acl_file``: Mosquitto 2.0's ACL file checks delivery (by the message's topic)
but never SUBSCRIBE, so a device could subscribe to ``$share/<gateway group>/hb/v1/dev/+/up/#``, get a
SUBACK and take its turn in the gateway's share group. The plugin checks SUBSCRIBE against its
``subscribePattern`` ACLs with the filter as sent, ``$share/<group>/`` included: a device's foreign or
shared subscription is refused in the SUBACK (reason 0x87 in MQTT 5, 0x80 in 3.1.1). Checked on Debian's
Mosquitto 2.0.11: for certificate clients the plugin does not authenticate (Mosquitto skips the password
check), it looks the client up by username = CN, and a username it does not know is refused everything;
2.0's plugin has no ``%u`` substitution in ACL topics, hence one role per device.

Persistence is on and queues are sized for devices that stay offline for hours (messages beyond
``max_queued_messages``/``max_queued_bytes`` per client are dropped).

Certificate files are copied into ``DIR/certs`` and referenced by absolute path (Mosquitto resolves
relative paths against its working directory, not the config file). The plugin's state is
``DIR/persist/dynsec.json`` (the plugin rewrites it on every change, so Mosquitto must be able to write
``persist/``); an existing one is kept, so regenerating the config does not forget enrolled devices.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.pki import GATEWAY_IDENTITY
from edge.protocol import MAX_PAYLOAD_BYTES, TOPIC_ROOT

__all__ = [
    "MosquittoConfig",
    "write_config",
    "dynsec_document",
    "device_role",
    "device_grant_commands",
    "device_revoke_commands",
    "find_dynsec_plugin",
    "DYNSEC_TOPIC",
    "DYNSEC_RESPONSE_TOPIC",
    "GATEWAY_ROLE",
]

DYNSEC_TOPIC = "$CONTROL/dynamic-security/v1"
DYNSEC_RESPONSE_TOPIC = DYNSEC_TOPIC + "/response"
GATEWAY_ROLE = "hb-gateway"
DEVICE_ROLE_PREFIX = "hb-dev-"
# Where distributions install the plugin (Debian/Ubuntu multiarch, the eclipse-mosquitto image, source builds).
DYNSEC_PLUGIN_PATHS = (
    "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib/mosquitto_dynamic_security.so",
    "/usr/local/lib/mosquitto_dynamic_security.so",
    "/usr/lib64/mosquitto_dynamic_security.so",
)


@dataclass(frozen=True)
class MosquittoConfig:
    """Knobs of the generated config. ``user`` is Mosquitto's ``user`` (it drops to ``mosquitto`` by
    default when started as root, which then must be able to read the files and write ``persist/``)."""

    port: int = 8883
    bind_address: str = "0.0.0.0"
    user: str | None = None
    max_queued_messages: int = 100_000
    max_queued_bytes: int = 256 * 1024 * 1024
    max_inflight_messages: int = 100
    persistent_client_expiration: str = "14d"
    autosave_interval_s: int = 60
    max_packet_size: int = MAX_PAYLOAD_BYTES + 4096
    gateway_identity: str = GATEWAY_IDENTITY
    dynsec_plugin: str | None = None  # None: the first of DYNSEC_PLUGIN_PATHS that exists


def find_dynsec_plugin(candidates: Sequence[str] = DYNSEC_PLUGIN_PATHS) -> str:
    """The path of Mosquitto's dynamic-security plugin, or :class:`FileNotFoundError` saying what to do."""
    for c in candidates:
        if Path(c).exists():
            return c
    raise FileNotFoundError("mosquitto_dynamic_security.so not found (looked in " + ", ".join(candidates) +
                            "). To fix: install Mosquitto 2.0 or later from your distribution, or pass "
                            "--dynsec-plugin PATH")


def _acl(acltype: str, topic: str) -> dict[str, Any]:
    return {"acltype": acltype, "topic": topic, "priority": 0, "allow": True}


def device_role(device_id: str) -> dict[str, Any]:
    """The role of one device: publish to its uplink subtree, subscribe to and receive its downlinks."""
    return {"rolename": DEVICE_ROLE_PREFIX + device_id, "acls": [
        _acl("publishClientSend", f"{TOPIC_ROOT}/{device_id}/up/#"),
        _acl("subscribePattern", f"{TOPIC_ROOT}/{device_id}/down/#"),
        _acl("publishClientReceive", f"{TOPIC_ROOT}/{device_id}/down/#"),
    ]}


def device_grant_commands(device_id: str) -> list[dict[str, Any]]:
    """Plugin commands that let ``device_id`` in (idempotent: "already exists" answers are harmless)."""
    role = device_role(device_id)
    return [{"command": "createRole", **role},
            {"command": "createClient", "username": device_id, "roles": [{"rolename": role["rolename"]}]}]


def device_revoke_commands(device_id: str) -> list[dict[str, Any]]:
    """Plugin commands that shut ``device_id`` out: deleting the client also disconnects it."""
    return [{"command": "deleteClient", "username": device_id},
            {"command": "deleteRole", "rolename": DEVICE_ROLE_PREFIX + device_id}]


def dynsec_document(gateway_identity: str = GATEWAY_IDENTITY) -> dict[str, Any]:
    """The plugin's initial state: deny by default; the gateway identity and its role; no device yet."""
    dev = f"{TOPIC_ROOT}/#"
    return {
        "defaultACLAccess": {"publishClientSend": False, "publishClientReceive": False, "subscribe": False,
                             "unsubscribe": True},
        "clients": [{"username": gateway_identity, "textname": "hybrid-broker gateway",
                     "roles": [{"rolename": GATEWAY_ROLE}]}],
        "groups": [],
        "roles": [{"rolename": GATEWAY_ROLE, "acls": [
            _acl("publishClientSend", dev), _acl("publishClientReceive", dev), _acl("subscribePattern", dev),
            _acl("subscribePattern", f"$share/+/{dev}"),
            _acl("publishClientSend", DYNSEC_TOPIC), _acl("publishClientReceive", DYNSEC_RESPONSE_TOPIC),
            _acl("subscribePattern", DYNSEC_RESPONSE_TOPIC),
        ]}],
    }


def write_config(
    out_dir: str | Path,
    *,
    ca_file: str | Path,
    cert_file: str | Path,
    key_file: str | Path,
    crl_file: str | Path,
    config: MosquittoConfig | None = None,
) -> Path:
    """Write ``mosquitto.conf``, ``certs/`` and ``persist/`` (with ``dynsec.json``) into ``out_dir``; return the
    conf path. Raises :class:`FileNotFoundError` when the dynamic-security plugin cannot be found."""
    cfg = config or MosquittoConfig()
    out = Path(out_dir).resolve()
    certs = out / "certs"
    persist = out / "persist"
    certs.mkdir(parents=True, exist_ok=True)
    persist.mkdir(parents=True, exist_ok=True)
    names = {"ca.pem": ca_file, "server.pem": cert_file, "server.key": key_file, "crl.pem": crl_file}
    for name, src in names.items():
        dst = certs / name
        if Path(src).resolve() != dst:
            shutil.copyfile(src, dst)
        dst.chmod(0o600 if name.endswith(".key") else 0o644)
    plugin = cfg.dynsec_plugin or find_dynsec_plugin()
    dynsec = persist / "dynsec.json"
    if not dynsec.exists():
        dynsec.write_text(json.dumps(dynsec_document(cfg.gateway_identity), indent=2))
        dynsec.chmod(0o600)
    lines = [
        "# hybrid-broker edge: Mosquitto 2.x production config (generated by `broker mqtt config`).",
        "per_listener_settings false",
        "allow_anonymous false",
        f"plugin {plugin}",
        f"plugin_opt_config_file {dynsec}",
        "persistence true",
        f"persistence_location {persist}/",
        f"autosave_interval {cfg.autosave_interval_s}",
        f"persistent_client_expiration {cfg.persistent_client_expiration}",
        f"max_queued_messages {cfg.max_queued_messages}",
        f"max_queued_bytes {cfg.max_queued_bytes}",
        f"max_inflight_messages {cfg.max_inflight_messages}",
        f"max_packet_size {cfg.max_packet_size}",
        "log_dest stderr",
        "log_type error",
        "log_type warning",
        "log_type notice",
        "connection_messages true",
    ]
    if cfg.user:
        lines.append(f"user {cfg.user}")
    lines += [
        "",
        f"listener {cfg.port} {cfg.bind_address}",
        f"cafile {certs / 'ca.pem'}",
        f"certfile {certs / 'server.pem'}",
        f"keyfile {certs / 'server.key'}",
        f"crlfile {certs / 'crl.pem'}",
        "require_certificate true",
        "use_identity_as_username true",
        "tls_version tlsv1.2",
        "",
    ]
    conf = out / "mosquitto.conf"
    conf.write_text("\n".join(lines))
    return conf
