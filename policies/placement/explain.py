"""One readable sentence saying why the placement won over the runner-up (or why nothing fits)."""

from __future__ import annotations

from broker.model import PlacementOption, PlacementResult

__all__ = ["explain", "describe"]


def describe(o: PlacementOption) -> str:
    """``aws:us-east-1 m6i.xlarge (on-demand)``, with the zone when known."""
    where = f"{o.provider}:{o.region}" + (f"/{o.zone}" if o.zone else "")
    return f"{where} {o.instance_type} ({o.capacity})"


def explain(res: PlacementResult) -> str:
    """The explanation of ``res`` (pure; also used for placement reports)."""
    best = res.placement
    if best is None:
        if not res.rejected:
            return "No feasible placement: the catalog offers nothing to consider."
        reason, count = max(res.rejected.items(), key=lambda kv: (kv[1], kv[0]))
        return (
            f"No feasible placement among {res.considered} offers; most were rejected by {reason} ({count}). "
            + ("To fix: set placement.burstable: allowed, or ask for other types." if reason == "BurstableType"
               else "To fix: relax that constraint.")
        )
    risk = f" + spot interruption risk ${best.interruption_usd:,.2f}" if best.interruption_usd >= 0.005 else ""
    head = (
        f"{describe(best)} wins at ${best.total_usd:,.2f} total "
        f"(compute ${best.compute_usd:,.2f} + egress ${best.egress_usd:,.2f}{risk})"
    )
    if not res.alternatives:
        return head + f"; it is the only feasible choice among {res.considered} offers."
    ru = res.alternatives[0]
    d_total = ru.total_usd - best.total_usd
    d_compute = ru.compute_usd - best.compute_usd
    d_egress = ru.egress_usd - best.egress_usd
    if abs(d_total) < 0.005:  # a tie: no "$0.00 less"
        return head + (
            f"; a tie: the runner-up {describe(ru)} costs the same (${ru.total_usd:,.2f}); this one finishes in "
            f"{best.finish_hours:.2f} h, the runner-up in {ru.finish_hours:.2f} h."
        )
    if d_total < 0:  # objective = time: the runner-up is cheaper but slower
        return (
            head + f", finishing in {best.finish_hours:.2f} h against {ru.finish_hours:.2f} h for the cheaper "
            f"runner-up {describe(ru)} at ${ru.total_usd:,.2f}."
        )
    if d_egress > d_compute:
        why = f"moving the data to the runner-up costs ${d_egress:,.2f} more in egress"
    elif ru.hourly_usd > best.hourly_usd:
        why = (f"the runner-up's compute costs ${d_compute:,.2f} more "
               f"(${ru.hourly_usd:.4f}/h against ${best.hourly_usd:.4f}/h)")
    else:
        why = (f"waiting for the runner-up's data adds ${d_compute:,.2f} of compute "
               f"({ru.transfer_hours:.2f} h of transfer)")
    return head + f", ${d_total:,.2f} less than the runner-up {describe(ru)}, because {why}."
