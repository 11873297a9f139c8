"""Gang placement (all or nothing, one zone, interconnect, spread/pack) and load-balancing plugins."""

from __future__ import annotations

import pytest

from policies.gang import GangPlacement, Slot, place_gang
from policies.loadbalance import Context, Pool, Predictive, choose_pool


def slot(zone: str, count: int, usd: float = 1.0, *, itype: str = "p4d", link: str | None = None,
         region: str = "us-east-1") -> Slot:
    return Slot("aws", region, itype, usd, count, zone=zone, interconnect=link)


@pytest.mark.parametrize(
    ("nodes", "slots", "kw", "zones", "usd"),
    [
        (4, [slot("a", 2, 1.0), slot("b", 2, 1.0)], {}, {"aws:us-east-1:a": 2, "aws:us-east-1:b": 2}, 4.0),
        (4, [slot("a", 2, 1.0), slot("b", 4, 2.0)], {"same_zone": True}, {"aws:us-east-1:b": 4}, 8.0),
        (4, [slot("a", 3, 1.0), slot("a", 3, 1.5, itype="x"), slot("b", 4, 1.2)], {"same_zone": True},
         {"aws:us-east-1:a": 4}, 4.5),
        (2, [slot("a", 2, 1.0), slot("a", 2, 3.0, itype="dgx", link="nvswitch")], {"interconnect": "nvlink"},
         {"aws:us-east-1:a": 2}, 6.0),
        (4, [slot("a", 2, 1.0), slot("a", 2, 3.0, itype="dgx", link="nvlink")], {"interconnect": "nvlink"},
         {"aws:us-east-1:a": 4}, 8.0),
        (3, [slot("a", 3, 1.0), slot("b", 3, 1.1), slot("c", 3, 1.2)], {"policy": "spread"},
         {"aws:us-east-1:a": 1, "aws:us-east-1:b": 1, "aws:us-east-1:c": 1}, 3.3),
        (3, [slot("a", 3, 1.0), slot("b", 3, 1.1), slot("c", 3, 1.2)], {"policy": "pack"},
         {"aws:us-east-1:a": 3}, 3.0),
        (5, [slot("a", 3, 1.0), slot("b", 3, 1.1)], {"policy": "pack"}, {"aws:us-east-1:a": 3, "aws:us-east-1:b": 2},
         5.2),
    ],
    ids=[
        "a gang may span zones when not asked to stay in one",
        "same_zone takes the zone that holds all nodes even if dearer per node",
        "same_zone mixes instance types within the zone",
        "nvswitch satisfies a wish for nvlink and is preferred",
        "without enough nvlink nodes it falls back to any",
        "spread puts one node per zone",
        "pack fills the cheapest zone",
        "pack spills into the next zone only when needed",
    ],
)
def test_place_gang(nodes: int, slots: list[Slot], kw: dict, zones: dict[str, int], usd: float) -> None:
    result = place_gang(nodes, slots, **kw)
    assert isinstance(result, GangPlacement), result
    assert result.nodes == nodes
    per_zone: dict[str, int] = {}
    for s, n in result.assignments:
        per_zone[s.zone_key] = per_zone.get(s.zone_key, 0) + n
    assert per_zone == zones
    assert result.hourly_usd == pytest.approx(usd)


@pytest.mark.parametrize(
    ("nodes", "slots", "kw", "text"),
    [
        (5, [slot("a", 2), slot("b", 2)], {}, "needs 5 nodes; only 4 free"),
        (3, [slot("a", 2), slot("b", 2)], {"same_zone": True}, "largest zone has 2 free"),
        (2, [slot("a", 4)], {"interconnect": "nvlink", "require_interconnect": True}, "with nvlink interconnect"),
    ],
    ids=["not enough nodes anywhere places none", "no single zone holds the gang",
         "a required interconnect is not available"],
)
def test_gang_all_or_nothing(nodes: int, slots: list[Slot], kw: dict, text: str) -> None:
    result = place_gang(nodes, slots, **kw)
    assert isinstance(result, str) and result.startswith("GangUnschedulable: ") and text in result


POOLS = (Pool("rack-a", slots=4, running=3), Pool("rack-b", slots=4, running=1), Pool("rack-c", slots=8, running=6))
HISTORY = {"rack-a": [1.0, 1.0], "rack-b": [3.0, 3.0], "rack-c": [2.0]}


@pytest.mark.parametrize(
    ("weights", "last", "history", "chosen"),
    [
        ({"round-robin": 1}, None, {}, "rack-a"),
        ({"round-robin": 1}, "rack-a", {}, "rack-b"),
        ({"round-robin": 1}, "rack-c", {}, "rack-a"),
        ({"least-loaded": 1}, None, {}, "rack-b"),
        ({"performance": 1}, None, HISTORY, "rack-a"),
        ({"performance": 1}, None, {}, "rack-a"),
        ({"predictive": 1}, None, HISTORY, "rack-a"),
        ({"least-loaded": 3, "performance": 1}, None, HISTORY, "rack-b"),
    ],
    ids=[
        "round robin starts at the first pool",
        "round robin moves to the next pool",
        "round robin wraps around",
        "least loaded takes the emptiest pool",
        "performance takes the fastest measured pool",
        "without history performance is neutral and the name breaks the tie",
        "predictive weighs queue wait and measured runtime",
        "weights combine plugins",
    ],
)
def test_choose_pool(weights: dict, last: str | None, history: dict, chosen: str) -> None:
    assert choose_pool(Context(POOLS, history, last=last), weights).pool == chosen


def test_predictive_counts_the_queue_ahead() -> None:
    ctx = Context((Pool("a", 1, running=1, queued=2), Pool("b", 1)), {"a": [1.0], "b": [2.0]})
    assert Predictive().predicted_hours(ctx.pools[0], ctx) == pytest.approx(4.0)
    assert Predictive().predicted_hours(ctx.pools[1], ctx) == pytest.approx(2.0)
    assert choose_pool(ctx, {"predictive": 1}).pool == "b"


def test_load_balance_config_errors() -> None:
    with pytest.raises(ValueError, match="unknown load-balancing plugin"):
        choose_pool(Context(POOLS), {"random": 1})
    with pytest.raises(ValueError, match="no pool has any slots"):
        choose_pool(Context((Pool("x", 0),)), {"least-loaded": 1})
