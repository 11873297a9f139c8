"""Batch placement under capacity: heuristic and the HiGHS model agree on small instances."""

from __future__ import annotations

import math
import random

import pytest

from policies.batch import (
    BatchJob,
    Candidate,
    PoolCapacity,
    candidates_from_options,
    evaluate,
    gap,
    solve_exact,
    solve_heuristic,
)
from tests.policies.builders import make_option


def job(id: str, *cands: tuple[str, float, float]) -> BatchJob:
    return BatchJob(id, tuple(Candidate(p, usd, cpu) for p, usd, cpu in cands))


@pytest.mark.parametrize(
    ("jobs", "capacity", "cost", "unplaced"),
    [
        ([job("a", ("x", 1, 4), ("y", 2, 4)), job("b", ("x", 1, 4), ("y", 2, 4))], {"x": PoolCapacity(8)}, 2.0, 0),
        ([job("a", ("x", 1, 4), ("y", 2, 4)), job("b", ("x", 1, 4), ("y", 2, 4))], {"x": PoolCapacity(4)}, 3.0, 0),
        ([job("a", ("x", 1, 4), ("y", 10, 4)), job("b", ("x", 1, 4), ("y", 2, 4))], {"x": PoolCapacity(4)}, 3.0, 0),
        ([job("a", ("x", 1, 4)), job("b", ("x", 1, 4))], {"x": PoolCapacity(4)}, 1.0, 1),
        ([job("a", ("x", 1, 3)), job("b", ("x", 1, 3)), job("c", ("x", 5, 6))], {"x": PoolCapacity(6)}, 2.0, 1),
        ([job("big", ("x", 1, 6), ("y", 9, 6)), job("s1", ("x", 1, 3), ("y", 1.5, 3)),
          job("s2", ("x", 1, 3), ("y", 1.5, 3))], {"x": PoolCapacity(6), "y": PoolCapacity(6)}, 4.0, 0),
        ([job("g", ("x", 1, 0))], {"x": PoolCapacity(math.inf, 0)}, 1.0, 0),
    ],
    ids=[
        "room for both in the cheap pool",
        "the cheap pool holds one, the other goes to the dearer one",
        "the job that would lose most by moving keeps the cheap pool",
        "a job without room stays unplaced",
        "placing more jobs wins over placing one dear job",
        "eviction: a big job takes the cheap pool and small ones move",
        "a candidate using no gpus fits a pool without gpus",
    ],
)
def test_heuristic_and_exact_agree_on_small_instances(jobs: list, capacity: dict, cost: float,
                                                       unplaced: int) -> None:
    exact = solve_exact(jobs, capacity, time_limit_seconds=10)
    heur = solve_heuristic(jobs, capacity)
    for r in (exact, heur):
        assert evaluate(jobs, capacity, r.assignment) == []
        assert r.cost_usd == pytest.approx(cost)
        assert len(r.unplaced) == unplaced
    assert exact.status == "optimal" and exact.gap is not None and exact.gap <= 1e-6
    assert gap(heur, exact) == pytest.approx(0.0, abs=1e-9)


def test_random_instances_stay_feasible_and_close_to_the_optimum() -> None:
    rng = random.Random(7)
    pools = [f"aws:r{i}" for i in range(6)] + ["onprem:rack"]
    jobs = []
    for j in range(150):
        cpu = rng.choice([2, 4, 8])
        gpu = rng.choice([0, 0, 0, 1])
        base = rng.uniform(1, 10)
        jobs.append(BatchJob(f"j{j}", tuple(
            Candidate(p, 0.0 if p == "onprem:rack" else base * rng.uniform(1, 1.4), cpu, gpu)
            for p in rng.sample(pools, 4))))
    capacity = {p: PoolCapacity(120, 6) for p in pools}
    heur = solve_heuristic(jobs, capacity)
    exact = solve_exact(jobs, capacity, time_limit_seconds=20)
    assert evaluate(jobs, capacity, heur.assignment) == [] and evaluate(jobs, capacity, exact.assignment) == []
    assert exact.objective_usd <= heur.objective_usd + 1e-6
    assert gap(heur, exact) < 0.05
    assert heur.lower_bound_usd is not None and heur.lower_bound_usd <= exact.objective_usd + 1e-6


def test_candidates_from_placement_options() -> None:
    cands = candidates_from_options([make_option("aws", "eu-west-1", total=3.5, vcpus=8, gpus=1)], nodes=2)
    assert cands == (Candidate("aws:eu-west-1", 3.5, 16, 2.0, "aws:eu-west-1:m5.large:on-demand"),)


def test_empty_batch() -> None:
    assert solve_heuristic([], {}).placed == 0


@pytest.mark.parametrize("method", ["solve_lp_round", "solve_lagrangian"],
                         ids=["the LP-rounding heuristic", "the Lagrangian heuristic"])
def test_each_heuristic_is_feasible_and_bounded_by_its_lower_bound(method: str) -> None:
    import policies.batch as batch

    rng = random.Random(11)
    pools = [f"gcp:r{i}" for i in range(5)]
    jobs = [BatchJob(f"j{j}", tuple(Candidate(p, rng.uniform(1, 5), rng.choice([1, 2, 4])) for p in
                                    rng.sample(pools, 3))) for j in range(80)]
    capacity = {p: PoolCapacity(40) for p in pools}
    result = getattr(batch, method)(jobs, capacity)
    exact = solve_exact(jobs, capacity, time_limit_seconds=20)
    assert evaluate(jobs, capacity, result.assignment) == []
    assert result.lower_bound_usd is not None
    assert result.lower_bound_usd <= exact.objective_usd + 1e-6 <= result.objective_usd + 2e-6
    assert gap(result, exact) < 0.05
