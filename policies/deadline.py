"""Deadline feasibility: admit a job only where its predicted finish meets its deadline.

Predicted finish of an option = ``now`` + queue wait + transfer time + duration (``PlacementOption.
finish_hours`` is transfer + duration). :func:`choose_for_deadline` takes the ranked options of placement
and returns the cheapest one that meets the deadline, with what meeting it costs compared to the cheapest
option overall ("meets the deadline for $X more than the cheapest"). When nothing meets it the decision is
``DeadlineInfeasible``: the broker fails the job at once with that explanation (see :func:`is_terminal`),
it never waits for a deadline that cannot be met.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.model import PlacementOption

__all__ = ["REASON", "DeadlineDecision", "predicted_finish", "choose_for_deadline", "is_terminal"]

REASON = "DeadlineInfeasible"

WaitHours = float | Mapping[str, float] | Callable[[PlacementOption], float]


def _wait(option: PlacementOption, wait_hours: WaitHours) -> float:
    if callable(wait_hours):
        return float(wait_hours(option))
    if isinstance(wait_hours, Mapping):
        return float(wait_hours.get(f"{option.provider}:{option.region}", wait_hours.get(option.provider, 0.0)))
    return float(wait_hours)


def predicted_finish(
    option: PlacementOption, now: datetime, *, wait_hours: WaitHours = 0.0, duration_hours: float | None = None
) -> datetime:
    """When a job placed on ``option`` now would finish. ``wait_hours`` is the queue wait (a number, a map
    keyed ``provider:region`` or ``provider``, or a function of the option); ``duration_hours`` is used
    only when the option carries no ``finish_hours``."""
    hours = option.finish_hours
    if hours <= 0 and duration_hours is not None:
        hours = option.transfer_hours + duration_hours
    return now + timedelta(hours=_wait(option, wait_hours) + hours)


def _where(o: PlacementOption) -> str:
    return f"{o.provider}:{o.region} {o.instance_type} ({o.capacity})"


@dataclass(frozen=True, slots=True)
class DeadlineDecision:
    """``option`` to use (``None`` when no option meets the deadline), the ``cheapest`` option overall,
    ``premium_usd`` = option.total - cheapest.total, and a readable ``explanation``."""

    option: PlacementOption | None
    cheapest: PlacementOption | None
    premium_usd: float
    explanation: str

    @property
    def feasible(self) -> bool:
        return self.option is not None


def choose_for_deadline(
    options: Sequence[PlacementOption],
    *,
    deadline: datetime | None,
    now: datetime,
    wait_hours: WaitHours = 0.0,
    duration_hours: float | None = None,
) -> DeadlineDecision:
    """Cheapest option of ``options`` whose predicted finish is at or before ``deadline`` (ties by
    earlier finish). Without a deadline, the cheapest option. With no options, an infeasible decision."""
    if not options:
        return DeadlineDecision(None, None, 0.0, f"{REASON}: no placement option at all")
    finish = {id(o): predicted_finish(o, now, wait_hours=wait_hours, duration_hours=duration_hours) for o in options}
    ranked = sorted(options, key=lambda o: (o.total_usd, finish[id(o)]))
    cheapest = ranked[0]
    if deadline is None:
        return DeadlineDecision(cheapest, cheapest, 0.0, "no deadline: the cheapest option")
    if deadline <= now:
        return DeadlineDecision(
            None, cheapest, 0.0,
            f"{REASON}: the deadline {deadline:%Y-%m-%dT%H:%MZ} has already passed. To fix: set a later deadline",
        )
    meeting = [o for o in ranked if finish[id(o)] <= deadline]
    if not meeting:
        fastest = min(options, key=lambda o: (finish[id(o)], o.total_usd))
        late_h = (finish[id(fastest)] - deadline) / timedelta(hours=1)
        return DeadlineDecision(
            None, cheapest, 0.0,
            f"{REASON}: no option finishes by {deadline:%Y-%m-%dT%H:%MZ}; the fastest, {_where(fastest)}, "
            f"finishes at {finish[id(fastest)]:%Y-%m-%dT%H:%MZ} ({late_h:.2f} h late). "
            "To fix: move the deadline, allow more providers/regions, or shorten the job",
        )
    chosen = meeting[0]
    premium = chosen.total_usd - cheapest.total_usd
    if chosen is cheapest:
        text = f"the cheapest option meets the deadline (finishes {finish[id(chosen)]:%Y-%m-%dT%H:%MZ})"
    else:
        late_h = (finish[id(cheapest)] - deadline) / timedelta(hours=1)
        text = (
            f"meets the deadline for ${premium:.2f} more than the cheapest: {_where(chosen)} finishes "
            f"{finish[id(chosen)]:%Y-%m-%dT%H:%MZ}, the cheapest, {_where(cheapest)}, would be {late_h:.2f} h late"
        )
    return DeadlineDecision(chosen, cheapest, premium, text)


def is_terminal(reason: str | None) -> bool:
    """True for reasons that must fail the job at once rather than hold it (deadline infeasible)."""
    return bool(reason) and str(reason).startswith(REASON)
