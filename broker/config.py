"""Settings of ``broker serve``, read from the environment (see ``docs/CONFIG.md``); CLI flags win.

:func:`load_settings` is the one way to build :class:`Settings`: it reads ``BROKER_*`` variables from a
mapping (``os.environ`` by default) and then applies explicit overrides (the CLI flags), so tests never
touch the process environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from broker.errors import SpecError

__all__ = ["Settings", "load_settings", "DEFAULT_PROVIDERS", "GANG_POLICIES", "parse_load_balancing"]

DEFAULT_PROVIDERS: tuple[str, ...] = ("onprem", "aws", "azure", "gcp")
GANG_POLICIES: tuple[str, ...] = ("pack", "spread")  # BROKER_GANG_SPREAD (policies.gang.PACK / SPREAD)


MAX_LAUNCH_CONCURRENCY = 64  # threads the scheduler may launch with at once
DEFAULT_DRY_RUN_SPEEDUP = 3600.0  # a dry-run job estimated at 1 h "runs" for 1 s


@dataclass(frozen=True)
class Settings:
    """Everything the service needs to start. Paths are absolute once built by :func:`load_settings`.

    ``database_url`` empty means ``sqlite:///<data_dir>/broker.db``; see :attr:`effective_database_url`.
    ``dry_run_speedup`` divides the wall time of dry-run cloud jobs: by default 3600, so a job estimated at
    1 h "runs" for 1 s (nobody wants to wait hours for a simulation); 1.0 means real time.
    ``scheduler_enabled`` False runs only the API
    (benchmarks and API tests drive the scheduler by hand).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = field(default_factory=lambda: Path.home() / ".hybrid-broker")
    database_url: str = ""
    admin_token: str | None = None
    catalog_dir: Path | None = None
    inventory: Path | None = None
    egress_config: Path | None = None
    max_body_bytes: int = 1_048_576
    scheduler_interval_seconds: float = 1.0
    providers: tuple[str, ...] = DEFAULT_PROVIDERS
    mqtt_url: str | None = None
    mqtt_ca_file: Path | None = None
    mqtt_cert_file: Path | None = None
    mqtt_key_file: Path | None = None
    ca_key_file: Path | None = None
    log_level: str = "INFO"
    dry_run_speedup: float = DEFAULT_DRY_RUN_SPEEDUP
    scheduler_enabled: bool = True
    scheduler_batch: int = 500
    # at most this long a job's launch waits between transient retries inside one scheduler cycle; a longer
    # delay blocks the offer for that long and the job moves on (providers.failover.provision)
    launch_retry_wait_seconds: float = 10.0
    launch_concurrency: int = 1  # launches in flight at once in the scheduler's step 5
    max_burst_jobs: int = 10_000
    # --- gang jobs and load balancing (policies.gang, policies.loadbalance) ---
    gang_spread: str = "pack"
    load_balancing: str = "least-loaded"
    load_balancing_tolerance: float = 0.01
    # --- who on-prem jobs run as (providers.sandbox): user | auto | off ---
    onprem_sandbox: str = "auto"
    # --- fleet operations (broker.ops, docs/OPERATIONS.md) ---
    ops_sample_seconds: float = 60.0
    alert_eval_seconds: float = 60.0
    heartbeat_timeout_seconds: float = 60.0
    device_lost_after_seconds: float | None = None  # None: lost devices are left to the edge runner
    alert_webhook_url: str | None = None
    alert_webhook_secret: str | None = None

    @property
    def load_balancing_weights(self) -> dict[str, float]:
        """Plugin weights of ``load_balancing`` (see :func:`parse_load_balancing`); empty = off."""
        return parse_load_balancing(self.load_balancing)

    @property
    def effective_database_url(self) -> str:
        """The SQLAlchemy URL of the store (SQLite in the data directory unless ``database_url`` is set)."""
        return self.database_url or f"sqlite:///{self.data_dir / 'broker.db'}"

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with ``overrides`` applied; ``None`` values are ignored (an absent CLI flag)."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser().resolve() if value else None


def _number(env: Mapping[str, str], key: str, default: float, *, integer: bool = False) -> Any:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise SpecError(key, f"must be {kind}, got {raw!r}. To fix: set {key} to {kind}") from None
    if value <= 0:
        raise SpecError(key, f"must be positive, got {raw!r}. To fix: set {key} to a positive value")
    return value


def parse_load_balancing(value: str, key: str = "BROKER_LOAD_BALANCING") -> dict[str, float]:
    """``none`` -> ``{}``; ``least-loaded`` -> ``{"least-loaded": 1.0}``; a comma list of ``name[:weight]``
    (``least-loaded:1,performance:2``) -> those weights. Names are the plugins of
    :data:`policies.loadbalance.SCORERS`; anything else raises :class:`SpecError` naming ``key``."""
    from policies.loadbalance import SCORERS

    text = value.strip().lower()
    if text in ("", "none", "off"):
        return {}
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, raw = part.partition(":")
        name = name.strip()
        if name not in SCORERS:
            raise SpecError(key, f"unknown load-balancing plugin {name!r}. To fix: use none or one of "
                                 f"{', '.join(sorted(SCORERS))} (optionally name:weight, comma-separated)")
        try:
            weight = float(raw) if raw.strip() else 1.0
        except ValueError:
            raise SpecError(key, f"weight {raw!r} of {name} is not a number. To fix: write {name}:2") from None
        if weight < 0:
            raise SpecError(key, f"weight of {name} must be >= 0, got {raw!r}. To fix: use a non-negative weight")
        weights[name] = weight
    return weights


def _choice(env: Mapping[str, str], key: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = (env.get(key) or default).strip().lower()
    if raw not in allowed:
        raise SpecError(key, f"must be one of {', '.join(allowed)}, got {raw!r}. To fix: set {key} to one of them")
    return raw


def _ratio(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip().rstrip("%")) / (100.0 if raw.strip().endswith("%") else 1.0)
    except ValueError:
        raise SpecError(key, f"must be a number like 0.01 or 1%, got {raw!r}. To fix: set {key} so") from None
    if not 0.0 <= value < 1.0:
        raise SpecError(key, f"must be in [0, 1) (a fraction of the cheapest total), got {raw!r}. "
                             f"To fix: set {key} to e.g. 0.01")
    return value


def load_settings(env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build :class:`Settings` from ``env`` (default ``os.environ``) and then ``overrides`` (CLI flags).

    Raises :class:`SpecError` naming the variable when a value is malformed.
    """
    env = os.environ if env is None else env
    data_dir_raw = overrides.pop("data_dir", None) or env.get("BROKER_DATA_DIR") or "~/.hybrid-broker"
    data_dir = Path(data_dir_raw).expanduser().resolve()
    providers_raw = env.get("BROKER_PROVIDERS")
    providers = (
        tuple(p.strip() for p in providers_raw.split(",") if p.strip()) if providers_raw else DEFAULT_PROVIDERS
    )
    ca_dir = data_dir / "ca"
    settings = Settings(
        host=env.get("BROKER_HOST") or "127.0.0.1",
        port=_number(env, "BROKER_PORT", 8080, integer=True),
        data_dir=data_dir,
        database_url=env.get("BROKER_DATABASE_URL", ""),
        admin_token=env.get("BROKER_ADMIN_TOKEN") or None,
        catalog_dir=_path(env.get("BROKER_CATALOG_DIR")),
        inventory=_path(env.get("BROKER_INVENTORY")),
        egress_config=_path(env.get("BROKER_EGRESS_CONFIG")),
        max_body_bytes=_number(env, "BROKER_MAX_BODY_BYTES", 1_048_576, integer=True),
        scheduler_interval_seconds=_number(env, "BROKER_SCHEDULER_INTERVAL_SECONDS", 1.0),
        launch_retry_wait_seconds=_number(env, "BROKER_LAUNCH_RETRY_WAIT_SECONDS", 10.0),
        launch_concurrency=_number(env, "BROKER_SCHEDULER_LAUNCH_CONCURRENCY", 1, integer=True),
        providers=providers,
        mqtt_url=env.get("BROKER_MQTT_URL") or None,
        mqtt_ca_file=_path(env.get("BROKER_MQTT_CA_FILE")) or ca_dir / "ca.pem",
        mqtt_cert_file=_path(env.get("BROKER_MQTT_CERT_FILE")) or ca_dir / "gateway.pem",
        mqtt_key_file=_path(env.get("BROKER_MQTT_KEY_FILE")) or ca_dir / "gateway.key",
        ca_key_file=_path(env.get("BROKER_CA_KEY_FILE")) or ca_dir / "ca.key",
        log_level=(env.get("BROKER_LOG_LEVEL") or "INFO").upper(),
        dry_run_speedup=_number(env, "BROKER_DRY_RUN_SPEEDUP", DEFAULT_DRY_RUN_SPEEDUP),
        gang_spread=_choice(env, "BROKER_GANG_SPREAD", "pack", GANG_POLICIES),
        load_balancing=env.get("BROKER_LOAD_BALANCING") or "least-loaded",
        load_balancing_tolerance=_ratio(env, "BROKER_LOAD_BALANCING_TOLERANCE", 0.01),
        onprem_sandbox=_choice(env, "BROKER_ONPREM_SANDBOX", "auto", ("user", "auto", "off")),
        ops_sample_seconds=_number(env, "BROKER_OPS_SAMPLE_SECONDS", 60.0),
        alert_eval_seconds=_number(env, "BROKER_ALERT_EVAL_SECONDS", 60.0),
        heartbeat_timeout_seconds=_number(env, "BROKER_HEARTBEAT_TIMEOUT_SECONDS", 60.0),
        device_lost_after_seconds=(_number(env, "BROKER_DEVICE_LOST_AFTER_SECONDS", 1.0)
                                   if env.get("BROKER_DEVICE_LOST_AFTER_SECONDS", "0").strip() not in ("", "0")
                                   else None),
        alert_webhook_url=env.get("BROKER_ALERT_WEBHOOK_URL") or None,
        alert_webhook_secret=env.get("BROKER_ALERT_WEBHOOK_SECRET") or None,
    )
    parse_load_balancing(settings.load_balancing)  # refuse a bad value at start, naming the key
    settings = settings.with_overrides(**overrides)
    if settings.launch_concurrency > MAX_LAUNCH_CONCURRENCY:
        raise SpecError("BROKER_SCHEDULER_LAUNCH_CONCURRENCY", f"must be at most {MAX_LAUNCH_CONCURRENCY}, got "
                        f"{settings.launch_concurrency}. To fix: set it to 1..{MAX_LAUNCH_CONCURRENCY}")
    if settings.gang_spread not in GANG_POLICIES:
        raise SpecError("BROKER_GANG_SPREAD", f"must be one of {', '.join(GANG_POLICIES)}, got "
                                              f"{settings.gang_spread!r}. To fix: use pack or spread")
    parse_load_balancing(settings.load_balancing)
    if bool(settings.alert_webhook_url) != bool(settings.alert_webhook_secret):
        raise SpecError("BROKER_ALERT_WEBHOOK_URL", "set both BROKER_ALERT_WEBHOOK_URL and "
                                                    "BROKER_ALERT_WEBHOOK_SECRET (webhooks are signed), or neither")
    return settings
