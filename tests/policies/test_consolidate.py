"""Karpenter-style consolidation: delete an instance whose work fits elsewhere, else replace it by a
cheaper one; never disrupt what must not be."""

from __future__ import annotations

from policies.consolidate import Node, OfferShape, Pod, plan_consolidation


def _pod(i: str, cpu: float, mem: float = 1.0, **kw: bool) -> Pod:
    return Pod(i, cpu, mem, **kw)


def test_an_under_used_instance_is_deleted_when_its_work_fits_elsewhere() -> None:
    nodes = [Node("a", 8, 32, 0.40, (_pod("p1", 6),)), Node("b", 8, 32, 0.40, (_pod("p2", 1),)),
             Node("c", 8, 32, 0.40, (_pod("p3", 1), _pod("p4", 1)))]
    (action,) = plan_consolidation(nodes)
    assert action.kind == "delete" and action.node == "b" and action.saving_usd_per_hour == 0.40
    assert action.moves == (("p2", "a"),)  # first fit; c then received nothing and still has its own work


def test_a_full_fleet_is_left_alone_and_a_big_instance_is_replaced_by_a_cheaper_one() -> None:
    nodes = [Node("a", 8, 32, 0.40, (_pod("p1", 7),)), Node("big", 32, 128, 1.60, (_pod("p2", 3, 8),))]
    offers = [OfferShape("m.large", 2, 8, 0.10), OfferShape("m.xlarge", 4, 16, 0.20), OfferShape("m.4x", 16, 64, 0.8)]
    (action,) = plan_consolidation(nodes, offers)
    assert action.kind == "replace" and action.node == "big"
    assert action.replacement is not None and action.replacement.instance_type == "m.xlarge"
    assert abs(action.saving_usd_per_hour - 1.40) < 1e-9
    assert plan_consolidation([Node("a", 8, 32, 0.4, (_pod("p", 7),)), Node("b", 8, 32, 0.4, (_pod("q", 7),))]) == []


def test_do_not_disrupt_and_no_double_counting_of_free_capacity() -> None:
    nodes = [Node("a", 4, 16, 0.2, (_pod("p1", 3, do_not_disrupt=True),)),
             Node("b", 4, 16, 0.2, (_pod("p2", 1),)), Node("c", 4, 16, 0.2, (_pod("p3", 1),))]
    actions = plan_consolidation(nodes)
    # a stays (do-not-disrupt); b moves onto a (1 free vCPU); c then cannot use a's capacity again,
    # and b is gone, so c stays
    assert [(x.kind, x.node) for x in actions] == [("delete", "b")]
    assert actions[0].moves == (("p2", "a"),)
