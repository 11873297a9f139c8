"""The broker's FastAPI application: :func:`create_app` wires settings, store, catalog, providers,
metrics and the scheduler into one app, and mounts the routers of every area that exists.

``create_app`` does the start-up work before it returns (migrations to head, the admin token at first
start, the catalog), so an app is ready as soon as it exists; the lifespan only starts and stops the
scheduler thread. Everything per app lives in :class:`AppState` (``app.state.hb``): no globals.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from broker.clock import Clock, SystemClock
from broker.config import Settings
from broker.errors import (
    AuthError,
    BrokerError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    NotFoundError,
    SpecError,
)
from broker.metrics import Metrics
from broker.migrations import upgrade
from broker.model import Offer, PlacementResult
from broker.model import Request as PlacementRequest
from broker.store import GroupCommitter, JobRow, Store
from broker.tenants import TokenCache, ensure_admin_token

__all__ = ["create_app", "AppState", "ScaledClock", "OPTIONAL_ROUTERS", "build_providers"]

log = logging.getLogger("broker.app")

# At most this many jobs are group-committed in one transaction of the submission writer.
SUBMIT_BATCH_JOBS = 2000

# Routers of other areas, mounted when their module exists.
OPTIONAL_ROUTERS = ("broker.api_edge", "broker.api_reports", "broker.api_policies", "broker.api_ops")


class ScaledClock:
    """A clock whose time runs ``factor`` times faster than ``base`` from the moment it is built.

    The demo gives it to dry-run providers so a job estimated at 1 h "runs" for 3.6 s at factor 1000.
    """

    def __init__(self, base: Clock, factor: float) -> None:
        self.base = base
        self.factor = factor
        self._start_wall = base.now()
        self._start_mono = base.monotonic()

    def now(self) -> datetime:
        return self._start_wall + timedelta(seconds=(self.base.monotonic() - self._start_mono) * self.factor)

    def monotonic(self) -> float:
        return self._start_mono + (self.base.monotonic() - self._start_mono) * self.factor

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds / self.factor)


def build_providers(settings: Settings, clock: Clock, inventory: Any = None) -> dict[str, Any]:
    """The default providers of ``settings.providers``: the on-prem pool, and each cloud through the
    registry when its credentials are found, else a :class:`providers.dryrun.DryRunProvider`."""
    from providers import registry
    from providers.dryrun import DryRunProvider
    from providers.onprem import OnPremPool
    from providers.refresh import options_from_env

    usable = {c.name: c.usable for c in registry.check()}
    sim_clock: Clock = clock if settings.dry_run_speedup == 1.0 else ScaledClock(clock, settings.dry_run_speedup)
    out: dict[str, Any] = {}
    for name in settings.providers:
        if name == "onprem":
            out[name] = OnPremPool(inventory, settings.data_dir, clock=sim_clock, sandbox=settings.onprem_sandbox)
        elif usable.get(name):
            try:  # adapter options (regions, zones, endpoints, subnet...) from BROKER_<NAME>_* variables
                out[name] = registry.create(name, **options_from_env(name))
            except BrokerError as exc:
                log.warning("provider %s unusable (%s); running it in dry-run mode", name, exc)
                out[name] = DryRunProvider(name, clock=sim_clock)
        elif name in registry.CLOUDS:
            out[name] = DryRunProvider(name, clock=sim_clock)
        elif name in registry.POOLS:  # Slurm / Ray: options from BROKER_SLURM_* / BROKER_RAY_*
            try:
                out[name] = registry.create(name, data_dir=settings.data_dir)
            except BrokerError as exc:
                log.warning("provider %s skipped: %s", name, exc)
        else:
            try:
                out[name] = registry.create(name)
            except BrokerError as exc:
                log.warning("provider %s skipped: %s", name, exc)
    return out


class AppState:
    """Everything one app holds (``app.state.hb``). ``catalog`` may be ``None`` when it failed to load
    (then ``/readyz`` answers 503 and placement fails with a clear error)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        clock: Clock,
        providers: Mapping[str, Any],
        catalog: Any,
        egress: Any,
    ) -> None:
        self.settings = settings
        self.store = store
        self.clock = clock
        self.providers: dict[str, Any] = dict(providers)
        self.catalog = catalog
        self.egress = egress
        self.catalog_version: str = getattr(catalog, "version", "") if catalog is not None else ""
        self.known_namespaces: set[str] = set()
        # Request path: validated tokens (revocations through this process invalidate it at once) and
        # the single writer that group-commits job submissions.
        from broker.api import submission_weight, write_submissions

        self.token_cache = TokenCache()
        self.writer: GroupCommitter[Any, Any] = GroupCommitter(
            store, functools.partial(write_submissions, clock=clock), max_batch=SUBMIT_BATCH_JOBS,
            weight=submission_weight, name="hb-submit-writer",
        )
        self.metrics = Metrics(self._count_jobs)
        self.scheduler: Any = None
        self.first_admin_token: str | None = None
        # Extra offers (edge devices...): callables returning offers, asked at each placement.
        self.extra_offer_sources: list[Callable[[], list[Offer]]] = []
        # Extra sites for the egress model (edge devices and their measured links), asked after the offers.
        self.site_sources: list[Callable[[], list[Any]]] = []
        self._site_egress: tuple[tuple[Any, ...], Any] | None = None
        self.edge: Any = None  # broker.edge_provider.EdgeService when BROKER_MQTT_URL is set

    def _count_jobs(self) -> list[tuple[str, str, int]]:
        jobs = JobRow.__table__  # type: ignore[attr-defined]
        with self.store.read() as session:
            rows = session.execute(
                sa.select(jobs.c.namespace, jobs.c.state, sa.func.count()).group_by(jobs.c.namespace, jobs.c.state)
            )
            return [(r[0], r[1], int(r[2])) for r in rows]

    def extra_offers(self) -> list[Offer]:
        """Offers beyond the catalog: the on-prem pool's hosts, the Slurm/Ray pools (skipped with a warning
        while their engine does not answer) and every extra source (edge devices)."""
        from providers.registry import POOLS

        out: list[Offer] = []
        pool = self.providers.get("onprem")
        if pool is not None:
            out.extend(pool.offers())
        for name in POOLS:
            engine = self.providers.get(name)
            if engine is not None:
                try:
                    out.extend(engine.offers())
                except BrokerError as exc:
                    log.warning("offers of %s unavailable: %s", name, exc)
        for source in self.extra_offer_sources:
            out.extend(source())
        return out

    def visible_offers(self, namespace: str | None) -> list[Offer]:
        """:meth:`extra_offers` a caller of ``namespace`` may see (``None``: the admin, all): edge devices of other
        namespaces are left out, as the scheduler leaves them out of a job's placement (issue 17)."""
        offers = self.extra_offers()
        if namespace is None or self.edge is None:
            return offers
        fleet = self.edge.fleet
        return [o for o in offers
                if o.location.provider != "edge" or fleet.namespace_of(o.location.region) == namespace]

    def egress_model(self) -> Any:
        """The egress model with the sites of :attr:`site_sources` (edge devices) merged in; rebuilt only
        when those sites change, so its route cache survives between placements."""
        if not self.site_sources or self.egress is None:
            return self.egress
        sites = tuple(site for source in self.site_sources for site in source())
        if not sites:
            return self.egress
        cached = self._site_egress
        if cached is None or cached[0] != sites:
            cached = (sites, self.egress.with_sites(sites))
            self._site_egress = cached
        return cached[1]

    def place(
        self, request: PlacementRequest, *, now: datetime, extra_offers: list[Offer] | None = None, top: int = 5,
        baselines: bool = True,
    ) -> PlacementResult:
        """Placement of ``request`` over the catalog plus :meth:`extra_offers` (the ``broker place`` logic),
        with data transfer priced by :meth:`egress_model`. ``baselines=False`` leaves the savings baselines
        out (the scheduler adds them with :meth:`baselines` only to the placements it records)."""
        if self.catalog is None:
            raise BrokerError("the catalog is not loaded. To fix: check BROKER_CATALOG_DIR and the server log")
        from policies.placement import place  # type: ignore[attr-defined]

        extra = self.extra_offers() if extra_offers is None else extra_offers
        return place(request, self.catalog, self.egress_model(), top=top, now=now, extra_offers=extra,
                     baselines=baselines)

    def baselines(self, request: PlacementRequest, result: PlacementResult, *, now: datetime,
                  extra_offers: list[Offer]) -> dict[str, Any]:
        """The savings baselines of ``result`` (a :meth:`place` of ``request`` at ``now`` over
        ``extra_offers``), exactly as ``place(..., baselines=True)`` computes them."""
        if self.catalog is None:
            raise BrokerError("the catalog is not loaded. To fix: check BROKER_CATALOG_DIR and the server log")
        from policies.placement.baselines import decision_baselines

        return decision_baselines(request, self.catalog, self.egress_model(), result, now=now,
                                  extra_offers=extra_offers)

    def get_provider(self, name: str) -> Any:
        """The provider named ``name``; raises a provider error when it is not enabled here."""
        provider = self.providers.get(name)
        if provider is None:
            raise InvalidRequestError(
                f"provider {name!r} is not enabled on this broker. To fix: add it to BROKER_PROVIDERS",
                provider=name,
            )
        return provider

    def terminate_instances(self, provider: str, ids: list[str], request_id: str) -> None:
        """Terminate ``ids`` on ``provider``, best effort (start-up reconciliation catches what fails)."""
        try:
            self.get_provider(provider).terminate(ids, request_id)
        except Exception as exc:  # noqa: BLE001 - logged; reconciliation retries later
            log.warning("terminate %s on %s failed: %s", ids, provider, exc)
            self.metrics.provider_errors.labels(provider, getattr(exc, "kind", "provider")).inc()

    def offers_matching(
        self, provider: str | None, region: str | None, min_vcpus: float, min_memory_gib: float, min_gpus: int,
        limit: int, namespace: str | None = None,
    ) -> tuple[list[Offer], int]:
        """Offers with at least these resources, cheapest first (at most ``limit`` + the extra offers),
        and how many matched in all; ``namespace``: only the edge devices of that namespace
        (:meth:`visible_offers`)."""
        offers: list[Offer] = []
        total = 0
        if self.catalog is not None:
            idx = self.catalog.query(
                min_vcpus=min_vcpus, min_memory_gib=min_memory_gib, gpus=min_gpus,
                providers=(provider,) if provider else (), regions=(region,) if region else (),
            )
            total = len(idx)
            order = idx[self.catalog.hourly_usd[idx].argsort(kind="stable")]
            offers = self.catalog.offers(order[:limit])
        for o in self.visible_offers(namespace):
            it = o.instance_type
            if (
                (provider is None or o.location.provider == provider)
                and (region is None or o.location.region == region)
                and it.vcpus >= min_vcpus and it.memory_gib >= min_memory_gib and it.gpus >= min_gpus
            ):
                offers.append(o)
                total += 1
        return sorted(offers, key=lambda o: o.hourly_usd)[:limit], total


def _load_pricing(settings: Settings) -> tuple[Any, Any, Any]:
    import pricing

    catalog = pricing.load_catalog(settings.catalog_dir)
    inventory = pricing.load_inventory(settings.inventory)
    egress = pricing.load_egress(settings.egress_config, sites=inventory.sites)
    return catalog, egress, inventory


def _error(status: int, message: str, field: str | None = None) -> JSONResponse:
    body: dict[str, Any] = {"detail": message}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status)


class _RefuseNulMiddleware:
    """Answer 422 to a URL carrying a NUL character (``%00``): no database stores it in text, and PostgreSQL
    would turn it into an error deep in a query."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogatepass")
            query = scope.get("query_string", b"")
            path = scope.get("path", "")
            if any(b in part for b in (b"\x00", b"%00") for part in (raw, query)) or "\x00" in path:
                await JSONResponse({"detail": "the URL contains a NUL character. To fix: remove it"},
                                   status_code=422)(scope, receive, send)
                return
        await self.app(scope, receive, send)


API_DESCRIPTION = (
    "Cost-aware placement and execution of jobs across clouds, on-prem and edge.\n\n"
    "Every `/v1` call takes `Authorization: Bearer <token>`: the admin token (printed once at first start, or "
    "`BROKER_ADMIN_TOKEN`) or a namespace token (`broker tokens create -n NS`). Press **Authorize** and paste "
    "the token. Errors are JSON `{\"detail\": \"...\", \"field\": \"...\"}`."
)

_RST_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]+)`")


def _plain(text: str) -> str:
    """An API description without reStructuredText markup: ``x`` and :class:`x` become Markdown `x`."""
    text = _RST_ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema with descriptions in plain Markdown (built once, then cached like FastAPI's)."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                if isinstance(operation, dict) and isinstance(operation.get("description"), str):
                    operation["description"] = _plain(operation["description"])
    return app.openapi_schema  # type: ignore[return-value]


DOCS_ASSETS = "/docs-assets"


def _install_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` with their scripts and styles served from the fastapi-offline
    package: the pages work without internet."""
    from pathlib import Path

    import fastapi_offline
    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    static = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=static), name="docs-assets")

    def _root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        """Swagger UI of the schema (served offline)."""
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}/openapi.json", title="hybrid-broker API",
            oauth2_redirect_url=f"{root}/docs/oauth2-redirect",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            swagger_ui_parameters={"persistAuthorization": True, "validatorUrl": None},
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        """OAuth2 redirect page of the Swagger UI."""
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        """ReDoc view of the schema (served offline)."""
        root = _root(request)
        return get_redoc_html(
            openapi_url=f"{root}/openapi.json", title="hybrid-broker API",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        return _error(422, str(exc), exc.field)

    @app.exception_handler(ForbiddenError)
    async def _forbidden(_: Request, exc: ForbiddenError) -> JSONResponse:
        return _error(403, str(exc), exc.field)

    @app.exception_handler(NotFoundError)
    async def _nf(_: Request, exc: NotFoundError) -> JSONResponse:
        return _error(404, str(exc))

    @app.exception_handler(ConflictError)
    async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return _error(409, str(exc))

    @app.exception_handler(AuthError)
    async def _auth(_: Request, exc: AuthError) -> JSONResponse:
        return _error(503, str(exc))

    @app.exception_handler(BrokerError)
    async def _broker(_: Request, exc: BrokerError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(sa.exc.DataError)
    async def _data(_: Request, exc: sa.exc.DataError) -> JSONResponse:
        return _error(422, f"a value cannot be stored as given ({type(exc.orig).__name__}). To fix: check the input")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return JSONResponse(
            {"detail": f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid")),
             "field": field, "errors": [{k: e.get(k) for k in ("loc", "msg", "type")} for e in errors]},
            status_code=422,
        )


def create_app(
    settings: Settings,
    *,
    clock: Clock | None = None,
    providers: Mapping[str, Any] | None = None,
    catalog: Any = None,
    egress: Any = None,
    gateway_options: Mapping[str, Any] | None = None,
) -> FastAPI:
    """Build a ready broker app for ``settings``.

    ``clock`` defaults to the system clock; ``providers`` (name -> Provider) replaces the defaults of
    :func:`build_providers`; ``catalog``/``egress`` replace the loaded ones (tests pass tiny ones).
    When ``settings.mqtt_url`` is set the edge is wired in (:func:`broker.edge_provider.install_edge`:
    provider ``edge``, device offers and sites, the gateway's task sink) and the gateway connects on
    startup and disconnects on shutdown; ``gateway_options`` go to :class:`broker.gateway.Gateway`.
    Migrates the store to head and creates the admin token at first start (``settings.admin_token`` when
    set, else a random one kept in ``app.state.hb.first_admin_token`` and printed once on stderr).
    """
    clock = clock or SystemClock()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(settings.effective_database_url)
    upgrade(store.engine)
    first_token = ensure_admin_token(store, now=clock.now(), configured=settings.admin_token)

    inventory = None
    if catalog is None or egress is None:
        try:
            loaded_catalog, loaded_egress, inventory = _load_pricing(settings)
        except (BrokerError, OSError, ImportError) as exc:
            log.error("catalog not loaded: %s", exc)
            loaded_catalog, loaded_egress = None, None
        catalog = catalog if catalog is not None else loaded_catalog
        egress = egress if egress is not None else loaded_egress
    if catalog is not None:  # history is never re-priced: keep the version placements use (what-if reads it)
        try:
            import pricing

            pricing.CatalogStore(settings.data_dir).save(catalog, label="placement catalog")
        except (BrokerError, OSError, ImportError) as exc:
            log.warning("catalog version not stored: %s", exc)
    if providers is None:
        providers = build_providers(settings, clock, inventory)

    state = AppState(settings, store, clock, providers, catalog, egress)
    state.first_admin_token = first_token
    if first_token is not None and settings.admin_token is None:
        print(f"broker: admin token (shown once, keep it): {first_token}", file=sys.stderr, flush=True)

    from broker.scheduler import Scheduler

    state.scheduler = Scheduler(state)
    # --- policies: quotas, budgets, priority classes, reservations at admission (broker.policy_store) ---
    from broker.policy_store import PolicyAdmission

    state.scheduler.admission_checks.append(
        PolicyAdmission(store, estimate=state.scheduler.estimate_usd, on_alert=state.scheduler.alert)
    )
    # --- edge: devices as capacity, the gateway as their provider (only with BROKER_MQTT_URL) ---
    if settings.mqtt_url:
        from broker.edge_provider import install_edge

        install_edge(state, gateway_options=gateway_options)
    # --- end edge ---
    # --- fleet operations (issue 14): metrics history, alerts, pools, health; one hook per cycle ---
    from broker.ops.service import install_ops

    install_ops(state)
    # --- end fleet operations ---
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        thread = None
        if state.edge is not None:
            state.edge.start()
        if settings.scheduler_enabled:
            stop.clear()
            thread = threading.Thread(target=state.scheduler.run_forever, args=(stop,), name="hb-scheduler",
                                      daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=30)
            if state.edge is not None:
                state.edge.stop()
            state.writer.close()
            store.dispose()

    app = FastAPI(
        title="hybrid-broker",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.openapi = functools.partial(_openapi, app)  # type: ignore[method-assign]
    _install_docs(app)
    app.state.hb = state
    _install_error_handlers(app)
    from broker.db_errors import install_store_error_handlers
    from broker.limits import BodyLimitMiddleware, install_input_error_handlers

    install_store_error_handlers(app)  # store outage: JSON 503 + Retry-After, logged once (issue 17)
    install_input_error_handlers(app)  # too deeply nested / out-of-range input: 422, not 500
    app.add_middleware(_RefuseNulMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)  # every route (issue 17)

    from broker.api import router

    app.include_router(router)
    for module_name in OPTIONAL_ROUTERS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        app.include_router(module.router)
    return app
