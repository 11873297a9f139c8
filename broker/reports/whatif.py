"""What-if: the recorded jobs re-placed under another policy, against the catalog version each
record used (never today's prices).

Scenarios: ``spot-everywhere`` (spot allowed for every job that said ``never``),
``exclude-<provider>`` (that provider removed from every job's allow-list) and, for the deadline
section, ``no-deadline`` (the deadline jobs without their deadline: the difference is what meeting
the deadlines cost).

On-prem and edge capacity is not in the catalogs: the on-prem/edge options stored in a record
are offered again as ``extra_offers`` at their recorded hourly price.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from broker.model import (
    Capacity,
    DataInput,
    InstanceType,
    Location,
    Objective,
    Offer,
    Request,
    SiteKind,
    SpotPolicy,
)
from broker.reports.model import WhatIf

if TYPE_CHECKING:
    from broker.reports.build import Rec

__all__ = ["run_whatif", "request_from_dict", "offers_from_options", "sample_evenly"]


def request_from_dict(d: dict[str, Any]) -> Request:
    """Rebuild the :class:`Request` stored by :func:`broker.decisions.request_to_dict`."""
    from broker.reports.build import _utc

    fields = {f.name for f in dataclasses.fields(Request)}
    kw: dict[str, Any] = {k: v for k, v in d.items() if k in fields}
    kw["data"] = tuple(DataInput(str(x["uri"]), str(x["location"]), float(x["size_gib"])) for x in d.get("data", ()))
    kw["providers"] = tuple(d.get("providers", ()))
    kw["regions"] = tuple(d.get("regions", ()))
    kw["deadline"] = _utc(d.get("deadline"))
    if "spot" in d:
        kw["spot"] = SpotPolicy(d["spot"])
    if "objective" in d:
        kw["objective"] = Objective(d["objective"])
    return Request(**kw)


def offers_from_options(options: Sequence[dict[str, Any]], request: Request) -> list[Offer]:
    """The on-prem/edge options of a record as offers (at their recorded hourly price)."""
    out = []
    for o in options:
        site = str(o.get("site", "cloud"))
        if site == SiteKind.CLOUD.value:
            continue
        it = InstanceType(
            name=str(o["instance_type"]),
            vcpus=float(o.get("vcpus", request.vcpus)),
            memory_gib=float(o.get("memory_gib", request.memory_gib)),
            gpus=int(o.get("gpus", 0)),
            accelerator=o.get("accelerator"),
            arch=request.arch if request.arch != "any" else "amd64",
        )
        loc = Location(str(o["provider"]), str(o["region"]), o.get("zone"), SiteKind(site))
        out.append(Offer(it, loc, Capacity(str(o.get("capacity", "owned"))), float(o["hourly_usd"]), "recorded"))
    return out


def sample_evenly(items: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` items spread evenly over ``items`` (all of them when few); deterministic."""
    n = len(items)
    if n <= limit:
        return list(items)
    if limit <= 0:
        return []
    return [items[(i * n) // limit] for i in range(limit)]


def _loader(catalogs: Any) -> Callable[[str], Any]:
    if hasattr(catalogs, "load"):
        return catalogs.load  # type: ignore[no-any-return]
    if callable(catalogs):
        return catalogs  # type: ignore[no-any-return]
    raise TypeError("whatif_catalogs must have .load(version) or be callable version -> Catalog")


def _defaults(egress: Any, place_fn: Callable[..., Any] | None) -> tuple[Any, Callable[..., Any]]:
    if place_fn is None:
        from policies.placement import place as place_fn_default  # type: ignore[import-not-found]

        place_fn = place_fn_default
    if egress is None:
        from pricing.egress import load_egress  # type: ignore[import-not-found]

        egress = load_egress()
    assert place_fn is not None
    return egress, place_fn


def _scenario(
    key: str,
    label: str,
    recs: Sequence[Rec],
    change: Callable[[Request, Any], Request | None],
    load: Callable[[str], Any],
    egress: Any,
    place_fn: Callable[..., Any],
    max_jobs: int,
) -> WhatIf:
    from broker.reports.build import options_of

    cache: dict[str, Any] = {}
    missing: set[str] = set()
    jobs = sample_evenly(recs, max_jobs)
    replaced = moved = unplaceable = 0
    recorded = whatif = 0.0
    for r in jobs:
        version = r.catalog_version
        if version in missing or not version:
            continue
        if version not in cache:
            try:
                cache[version] = load(version)
            except Exception:  # noqa: BLE001 - any failure to load means "not available"
                missing.add(version)
                continue
        catalog = cache[version]
        request = request_from_dict(r.request)
        changed = change(request, catalog)
        if changed is None:
            continue
        opts = options_of(r)
        result = place_fn(
            changed, catalog, egress, top=1, now=r.created_at, extra_offers=offers_from_options(opts, request)
        )
        replaced += 1
        assert r.chosen is not None
        recorded += float(r.chosen["total_usd"])
        if result.placement is None:
            unplaceable += 1
            whatif += float(r.chosen["total_usd"])  # it would not have run: count what it cost
            continue
        whatif += float(result.placement.total_usd)
        if (result.placement.provider, result.placement.region) != (r.chosen["provider"], r.chosen["region"]):
            moved += 1
    if replaced == 0:
        reason = (
            f"recorded catalog version(s) not found: {', '.join(sorted(missing))[:200]}"
            if missing
            else "no job this scenario changes"
        )
        return WhatIf(key, label, "unavailable", reason, jobs_total=len(recs))
    note = "" if len(jobs) == len(recs) else f"evenly spread sample of {len(jobs)} jobs"
    return WhatIf(
        key, label, "ok", note, len(recs), replaced, recorded, whatif, whatif - recorded, moved, unplaceable
    )


def run_whatif(
    placed: Sequence[Rec],
    *,
    catalogs: Any,
    egress: Any,
    place_fn: Callable[..., Any] | None,
    exclude_providers: Sequence[str] | None,
    max_jobs: int,
) -> tuple[tuple[WhatIf, ...], float | None, str]:
    """The what-if scenarios over ``placed``, and the deadline premium with its note.

    Returns ``(scenarios, premium_usd, premium_note)``; every scenario is ``unavailable`` (with the
    reason) when no catalogs are given or the placement code cannot be imported.
    """
    if exclude_providers is None:
        spend: dict[str, float] = {}
        for r in placed:
            if r.chosen is not None:
                p = str(r.chosen["provider"])
                spend[p] = spend.get(p, 0.0) + float(r.chosen["total_usd"])
        exclude_providers = [max(spend, key=lambda p: (spend[p], p))] if spend else []
    labels = [("spot-everywhere", "spot allowed everywhere")] + [
        (f"exclude-{p}", f"{p} excluded") for p in exclude_providers
    ]
    reason = ""
    if catalogs is None:
        reason = "the recorded catalogs were not given (pass --data-dir, or whatif_catalogs=)"
    else:
        try:
            egress, place_fn = _defaults(egress, place_fn)
        except ImportError as exc:
            reason = f"placement code not importable ({exc}). To fix: install hybrid-broker[server]"
    if reason:
        return (
            tuple(WhatIf(k, lbl, "unavailable", reason, jobs_total=len(placed)) for k, lbl in labels),
            None,
            f"unavailable: {reason}",
        )
    assert place_fn is not None
    load = _loader(catalogs)

    def spot(req: Request, _catalog: Any) -> Request | None:
        return dataclasses.replace(req, spot=SpotPolicy.ALLOWED) if req.spot == SpotPolicy.NEVER else req

    def exclude(provider: str) -> Callable[[Request, Any], Request | None]:
        def change(req: Request, catalog: Any) -> Request | None:
            allowed = req.providers or tuple(
                sorted({loc.provider for loc in catalog.locations} | {"onprem", "edge"})
            )
            return dataclasses.replace(req, providers=tuple(p for p in allowed if p != provider))

        return change

    def no_deadline(req: Request, _catalog: Any) -> Request | None:
        return dataclasses.replace(req, deadline=None)

    out = [_scenario("spot-everywhere", labels[0][1], placed, spot, load, egress, place_fn, max_jobs)]
    for p in exclude_providers:
        out.append(_scenario(f"exclude-{p}", f"{p} excluded", placed, exclude(p), load, egress, place_fn, max_jobs))
    deadline_jobs = [r for r in placed if r.deadline is not None]
    if not deadline_jobs:
        return tuple(out), 0.0, "no job had a deadline"
    nd = _scenario("no-deadline", "deadlines dropped", deadline_jobs, no_deadline, load, egress, place_fn, max_jobs)
    if nd.status != "ok":
        return tuple(out), None, f"unavailable: {nd.reason}"
    note = f"re-placed {nd.jobs_replaced} of {nd.jobs_total} deadline jobs without their deadline"
    return tuple(out), nd.recorded_usd - nd.whatif_usd, note
