"""Batch placement under capacity: place many jobs at once on finite capacity at least total cost.

Input: for each job a few :class:`Candidate` placements (typically the top-K options of
``policies.placement.place``), each charging its ``cost_usd`` and consuming ``vcpus``/``gpus`` of one
capacity *pool* (an on-prem host ``onprem:rack-a``, a cloud account's per-region quota ``aws:us-east-1``,
an edge device); and each pool's :class:`PoolCapacity`. A job may stay unplaced at ``penalty_usd``
(far above any cost, so the solvers place as many jobs as capacity allows first, then minimise dollars).

* :func:`solve_heuristic` is the scheduler's fast path. It runs :func:`solve_lp_round` (the LP relaxation
  solved by HiGHS's dual simplex; integral jobs are fixed, fractional ones fixed a few at a time by
  re-solving the rest ("diving"), then a local search of single moves, one-job evictions and swaps), and for
  batches under 500 jobs also :func:`solve_lagrangian` (capacity priced by subgradient steps on the
  Lagrangian relaxation, vectorised with numpy; regret-ordered greedy under those prices; the same local
  search), keeping the cheaper answer. The LP optimum is a lower bound, so every heuristic answer carries
  a proven ``gap``. Without ``highspy`` the Lagrangian heuristic runs alone (pure numpy + Python).
* :func:`solve_exact` builds the mixed-integer model (binary x[j,c]; sum_c x[j,c] + u[j] = 1;
  sum x[j,c] * use[c,r] <= cap[p,r] per pool p and resource r) and solves it with HiGHS (``highspy``),
  within a time limit, reporting the optimality gap.

Both return a :class:`BatchResult`; :func:`gap` compares two of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from broker.model import PlacementOption

__all__ = [
    "Candidate",
    "BatchJob",
    "PoolCapacity",
    "BatchResult",
    "pool_key",
    "candidates_from_options",
    "default_penalty",
    "solve_heuristic",
    "solve_lp_round",
    "solve_lagrangian",
    "solve_exact",
    "evaluate",
    "gap",
]

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run a job: ``cost_usd`` for the whole job, using ``vcpus``/``gpus`` of ``pool``."""

    pool: str
    cost_usd: float
    vcpus: float
    gpus: float = 0.0
    label: str = ""


@dataclass(frozen=True, slots=True)
class BatchJob:
    """A job and its candidate placements (order does not matter)."""

    id: str
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """Capacity of one pool; ``math.inf`` = unlimited."""

    vcpus: float = math.inf
    gpus: float = math.inf


@dataclass(frozen=True)
class BatchResult:
    """``assignment[job id]`` is the index of the chosen candidate, or ``None`` (unplaced).
    ``cost_usd`` sums the placed jobs' costs; ``objective_usd`` adds the penalties of unplaced ones.
    ``lower_bound_usd`` and ``gap`` (relative, objective vs bound) come from the exact solver;
    ``status`` is ``heuristic``, ``optimal``, ``time_limit`` or the solver's model status."""

    assignment: Mapping[str, int | None]
    cost_usd: float
    objective_usd: float
    unplaced: tuple[str, ...]
    method: str
    seconds: float
    status: str = "heuristic"
    lower_bound_usd: float | None = None
    gap: float | None = None
    usage: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def placed(self) -> int:
        return sum(1 for v in self.assignment.values() if v is not None)


def pool_key(option: PlacementOption) -> str:
    """The capacity pool an option draws on: ``provider:region`` (a cloud account's regional quota, an
    on-prem site, an edge device)."""
    return f"{option.provider}:{option.region}"


def candidates_from_options(options: Sequence[PlacementOption], *, nodes: int = 1) -> tuple[Candidate, ...]:
    """Candidates from placement options (``vcpus``/``gpus`` are per node; ``total_usd`` is the whole job)."""
    return tuple(
        Candidate(pool_key(o), o.total_usd, o.vcpus * nodes, float(o.gpus * nodes),
                  f"{o.provider}:{o.region}:{o.instance_type}:{o.capacity}")
        for o in options
    )


def default_penalty(jobs: Sequence[BatchJob]) -> float:
    """Penalty of leaving one job unplaced: above ``10 x`` the most expensive candidate, at least $1,000."""
    top = max((c.cost_usd for j in jobs for c in j.candidates), default=0.0)
    return max(1000.0, 10.0 * top + 1.0)


class _Arrays:
    """Flattened, indexed view of an instance (candidates of job j are ``start[j]:start[j+1]``)."""

    def __init__(self, jobs: Sequence[BatchJob], capacity: Mapping[str, PoolCapacity]) -> None:
        pools = sorted({c.pool for j in jobs for c in j.candidates} | set(capacity))
        self.pools = pools
        self.pool_index = {p: i for i, p in enumerate(pools)}
        self.cap_cpu = np.array([capacity.get(p, PoolCapacity()).vcpus for p in pools], dtype=float)
        self.cap_gpu = np.array([capacity.get(p, PoolCapacity()).gpus for p in pools], dtype=float)
        counts = [len(j.candidates) for j in jobs]
        self.start = np.zeros(len(jobs) + 1, dtype=np.int64)
        self.start[1:] = np.cumsum(counts)
        flat = [c for j in jobs for c in j.candidates]
        self.pool = np.array([self.pool_index[c.pool] for c in flat], dtype=np.int64)
        self.cost = np.array([c.cost_usd for c in flat], dtype=float)
        self.cpu = np.array([c.vcpus for c in flat], dtype=float)
        self.gpu = np.array([c.gpus for c in flat], dtype=float)


def _finish(
    jobs: Sequence[BatchJob], arr: _Arrays, choice: list[int], penalty: float, method: str, t0: float, **kw: object
) -> BatchResult:
    assignment: dict[str, int | None] = {}
    cost = 0.0
    unplaced = []
    use_cpu = np.zeros(len(arr.pools))
    use_gpu = np.zeros(len(arr.pools))
    for j, job in enumerate(jobs):
        c = choice[j]
        if c < 0:
            assignment[job.id] = None
            unplaced.append(job.id)
        else:
            assignment[job.id] = c - int(arr.start[j])
            cost += float(arr.cost[c])
            use_cpu[arr.pool[c]] += arr.cpu[c]
            use_gpu[arr.pool[c]] += arr.gpu[c]
    usage = {p: (float(use_cpu[i]), float(use_gpu[i])) for i, p in enumerate(arr.pools) if use_cpu[i] or use_gpu[i]}
    return BatchResult(
        assignment, cost, cost + penalty * len(unplaced), tuple(unplaced), method, time.perf_counter() - t0,
        usage=usage, **kw,  # type: ignore[arg-type]
    )


class _State:
    """Mutable assignment state of the heuristic (lists: plain Python is fastest for the scalar loops)."""

    def __init__(self, arr: _Arrays, n: int, penalty: float) -> None:
        self.n = n
        self.penalty = penalty
        self.start = arr.start.tolist()
        self.cost = arr.cost.tolist()
        self.cpu = arr.cpu.tolist()
        self.gpu = arr.gpu.tolist()
        self.pool = arr.pool.tolist()
        self.cap_cpu = arr.cap_cpu.tolist()
        self.cap_gpu = arr.cap_gpu.tolist()
        self.by_cost: list[list[int]] = [
            sorted(range(self.start[j], self.start[j + 1]), key=self.cost.__getitem__) for j in range(n)
        ]
        self.in_pool: list[dict[int, int]] = []
        for j in range(n):
            m: dict[int, int] = {}
            for c in reversed(self.by_cost[j]):
                m[self.pool[c]] = c
            self.in_pool.append(m)
        self.reset()

    def reset(self) -> None:
        self.left_cpu = list(self.cap_cpu)
        self.left_gpu = list(self.cap_gpu)
        self.choice = [-1] * self.n
        self.members: dict[int, set[int]] = {}

    def fits(self, c: int) -> bool:
        p = self.pool[c]
        return self.cpu[c] <= self.left_cpu[p] + _EPS and self.gpu[c] <= self.left_gpu[p] + _EPS

    def move(self, j: int, c: int) -> None:
        old = self.choice[j]
        if old >= 0:
            q = self.pool[old]
            self.left_cpu[q] += self.cpu[old]
            self.left_gpu[q] += self.gpu[old]
            self.members[q].discard(j)
        p = self.pool[c]
        self.left_cpu[p] -= self.cpu[c]
        self.left_gpu[p] -= self.gpu[c]
        self.choice[j] = c
        self.members.setdefault(p, set()).add(j)

    def unassign(self, j: int) -> None:
        old = self.choice[j]
        if old >= 0:
            q = self.pool[old]
            self.left_cpu[q] += self.cpu[old]
            self.left_gpu[q] += self.gpu[old]
            self.members[q].discard(j)
            self.choice[j] = -1

    def _best_swap(self, j: int, c: int, max_scan: int) -> tuple[float, int, int] | None:
        """A job ``k`` in ``c``'s pool that can take ``j``'s place (its candidate in ``j``'s pool) so that
        ``j`` moves to ``c``, if the swap saves money: ``(delta, k, k's new candidate)``."""
        cost, cpu, gpu, pool = self.cost, self.cpu, self.gpu, self.pool
        cj = self.choice[j]
        p, q = pool[c], pool[cj]
        best: tuple[float, int, int] | None = None
        for scanned, k in enumerate(self.members.get(p, ())):
            if scanned >= max_scan:
                break
            if k == j:
                continue
            ck = self.choice[k]
            alt = self.in_pool[k].get(q)
            if alt is None:
                continue
            # after the swap: p loses k, gains j; q loses j, gains k
            if cpu[c] > self.left_cpu[p] + cpu[ck] + _EPS or gpu[c] > self.left_gpu[p] + gpu[ck] + _EPS:
                continue
            if cpu[alt] > self.left_cpu[q] + cpu[cj] + _EPS or gpu[alt] > self.left_gpu[q] + gpu[cj] + _EPS:
                continue
            delta = cost[c] - cost[cj] + cost[alt] - cost[ck]
            if delta < -1e-7 and (best is None or delta < best[0]):
                best = (delta, k, alt)
        return best

    def current(self, j: int) -> float:
        c = self.choice[j]
        return self.cost[c] if c >= 0 else self.penalty

    def objective(self) -> float:
        return sum(self.current(j) for j in range(self.n))

    def greedy(self, job_order: Sequence[int], cand_order: Sequence[Sequence[int]], skip: list[bool] | None) -> None:
        """Each job in ``job_order`` takes its first candidate (in ``cand_order``) with room; candidates
        flagged in ``skip`` are passed over; then unplaced jobs take any room left, cheapest first."""
        self.reset()
        for j in job_order:
            for c in cand_order[j]:
                if (skip is None or not skip[c]) and self.fits(c):
                    self.move(j, c)
                    break
        for j in job_order:
            if self.choice[j] < 0:
                for c in self.by_cost[j]:
                    if self.fits(c):
                        self.move(j, c)
                        break

    def local_search(self, job_order: Sequence[int], max_passes: int, max_scan: int) -> None:
        """Move jobs to cheaper candidates with room; when the pool is full, evict one of at most
        ``max_scan`` of its jobs to that job's next candidate with room, if the pair saves money."""
        cost, cpu, gpu, pool = self.cost, self.cpu, self.gpu, self.pool
        for _ in range(max_passes):
            improved = False
            for j in job_order:
                here = self.current(j)
                for c in self.by_cost[j]:
                    if cost[c] >= here - 1e-7 or self.choice[j] == c:
                        break
                    if self.fits(c):
                        self.move(j, c)
                        improved = True
                        break
                    p = pool[c]
                    best: tuple[float, int, int] | None = None
                    for scanned, k in enumerate(self.members.get(p, ())):
                        if scanned >= max_scan:
                            break
                        ck = self.choice[k]
                        if k == j or cpu[c] > self.left_cpu[p] + cpu[ck] + _EPS or (
                            gpu[c] > self.left_gpu[p] + gpu[ck] + _EPS
                        ):
                            continue
                        for alt in self.by_cost[k]:
                            if pool[alt] == p or not self.fits(alt):
                                continue
                            delta = (cost[c] - here) + (cost[alt] - cost[ck])
                            if delta < -1e-7 and (best is None or delta < best[0]):
                                best = (delta, k, alt)
                            break
                    if best is None and self.choice[j] >= 0:
                        best = self._best_swap(j, c, max_scan)
                        if best is not None:
                            _, k, alt = best
                            self.unassign(j)
                            self.move(k, alt)
                            self.move(j, c)
                            improved = True
                            break
                    if best is not None:
                        _, k, alt = best
                        self.move(k, alt)
                        if self.fits(c):
                            self.move(j, c)
                            improved = True
                            break
            if not improved:
                break


    def place_unplaced(self, max_scan: int) -> None:
        """Give unplaced jobs a place by moving others: one job ``k`` out of a candidate's pool to ``k``'s
        alternative with room, or, failing that, a chain of two moves (``k`` to a full pool from which a
        third job ``m`` moves on to room elsewhere). Only moves that lower the objective are made."""
        cost, cpu, gpu, pool = self.cost, self.cpu, self.gpu, self.pool

        def frees(p: int, c: int, k: int) -> bool:
            ck = self.choice[k]
            return cpu[c] <= self.left_cpu[p] + cpu[ck] + _EPS and gpu[c] <= self.left_gpu[p] + gpu[ck] + _EPS

        for j in range(self.n):
            if self.choice[j] >= 0:
                continue
            done = False
            for c in self.by_cost[j]:
                if self.fits(c):
                    self.move(j, c)
                    break
                p = pool[c]
                for scanned, k in enumerate(list(self.members.get(p, ()))):
                    if scanned >= max_scan or done:
                        break
                    if not frees(p, c, k):
                        continue
                    ck = self.choice[k]
                    for alt in self.by_cost[k]:
                        q = pool[alt]
                        if q == p:
                            continue
                        if self.fits(alt):
                            if cost[c] + cost[alt] - cost[ck] < self.penalty:
                                self.move(k, alt)
                                self.move(j, c)
                                done = True
                            break
                        for scanned2, m in enumerate(list(self.members.get(q, ()))):
                            if scanned2 >= max_scan or done:
                                break
                            if m in (j, k) or not frees(q, alt, m):
                                continue
                            cm = self.choice[m]
                            for alt2 in self.by_cost[m]:
                                if pool[alt2] in (p, q) or not self.fits(alt2):
                                    continue
                                gain = cost[c] + cost[alt] - cost[ck] + cost[alt2] - cost[cm]
                                if gain < self.penalty:
                                    self.move(m, alt2)
                                    self.move(k, alt)
                                    self.move(j, c)
                                    done = True
                                break
                        if done:
                            break
                if done:
                    break


def solve_lagrangian(
    jobs: Sequence[BatchJob],
    capacity: Mapping[str, PoolCapacity],
    *,
    penalty_usd: float | None = None,
    iterations: int = 150,
    repair_every: int = 25,
    stall_limit: int = 8,
    theta0: float = 0.02,
    max_passes: int = 8,
    max_scan: int = 64,
    polish: int | None = None,
) -> BatchResult:
    """Lagrangian-priced greedy plus local search. Deterministic; pools missing from ``capacity`` are
    unlimited.

    Design choice: a plain cheapest-first greedy hands the cheap pools to whoever comes first. Here
    capacity gets a price per pool and resource (subgradient steps on the Lagrangian relaxation of the
    capacity rows, vectorised with numpy); jobs are ordered by regret under those prices and take the
    candidate cheapest under them, and a local search then works on real dollars. A few price rounds
    are repaired this way and the best feasible assignment wins.
    """
    t0 = time.perf_counter()
    penalty = default_penalty(jobs) if penalty_usd is None else penalty_usd
    arr = _Arrays(jobs, capacity)
    n = len(jobs)
    st = _State(arr, n, penalty)
    if n == 0:
        return _finish(jobs, arr, [], penalty, "lagrangian", t0)
    counts = np.diff(arr.start)
    has = counts > 0
    job_of = np.repeat(np.arange(n), counts)

    def order_and_rank(rc: np.ndarray) -> tuple[list[int], list[list[int]]]:
        srt = np.lexsort((rc, job_of))
        first = np.where(has, rc[srt[np.minimum(arr.start[:-1], len(srt) - 1)]] if len(srt) else 0.0, penalty)
        second_idx = np.minimum(arr.start[:-1] + 1, np.maximum(arr.start[1:] - 1, 0))
        second = np.where(counts >= 2, rc[srt[np.minimum(second_idx, max(len(srt) - 1, 0))]] if len(srt) else 0.0,
                          penalty)
        regret = np.minimum(second, penalty) - np.minimum(first, penalty)
        size = np.zeros(n)
        if len(srt):
            head = srt[np.minimum(arr.start[:-1], len(srt) - 1)]
            size = np.where(has, arr.gpu[head] * 1000.0 + arr.cpu[head], 0.0)
        job_order = np.lexsort((np.arange(n), -size, -regret)).tolist()
        flat = srt.tolist()
        cand = [flat[arr.start[j] : arr.start[j + 1]] for j in range(n)]
        return job_order, cand

    greedy_results: list[tuple[float, list[int], list[int]]] = []

    def attempt(rc: np.ndarray, skip: list[bool] | None) -> None:
        job_order, cand = order_and_rank(rc)
        st.greedy(job_order, cand, skip)
        greedy_results.append((st.objective(), list(st.choice), job_order))

    attempt(arr.cost, None)
    finite_c = np.isfinite(arr.cap_cpu)
    finite_g = np.isfinite(arr.cap_gpu)
    cap_c = np.where(finite_c, arr.cap_cpu, 0.0)
    cap_g = np.where(finite_g, arr.cap_gpu, 0.0)
    lam_c = np.zeros(len(arr.pools))
    lam_g = np.zeros(len(arr.pools))
    theta = theta0
    best_bound = -math.inf
    best_lam = (lam_c, lam_g)
    stall = 0
    seg = arr.start[:-1][has]
    for it in range(1, iterations + 1):
        rc = arr.cost + lam_c[arr.pool] * arr.cpu + lam_g[arr.pool] * arr.gpu
        mins = np.full(n, penalty)
        chosen_mask = np.zeros(len(rc), dtype=bool)
        if len(rc):
            seg_min = np.minimum.reduceat(rc, seg)
            mins[has] = np.minimum(seg_min, penalty)
            # the relaxed choice of each job: the first candidate at its segment minimum, if below the penalty
            at_min = np.flatnonzero(rc <= mins[job_of] + 1e-12)
            first = at_min[np.r_[True, job_of[at_min][1:] != job_of[at_min][:-1]]]
            chosen_mask[first[rc[first] < penalty]] = True
        bound = float(mins.sum() - lam_c @ cap_c - lam_g @ cap_g)
        if bound > best_bound + 1e-9:
            best_bound, best_lam, stall = bound, (lam_c, lam_g), 0
        else:
            stall += 1
            if stall >= stall_limit:
                theta, stall = theta / 2, 0
        use_c = np.bincount(arr.pool[chosen_mask], weights=arr.cpu[chosen_mask], minlength=len(arr.pools))
        use_g = np.bincount(arr.pool[chosen_mask], weights=arr.gpu[chosen_mask], minlength=len(arr.pools))
        g_c = np.where(finite_c, use_c - cap_c, 0.0)
        g_g = np.where(finite_g, use_g - cap_g, 0.0)
        g_c = np.where((lam_c <= 0) & (g_c < 0), 0.0, g_c)
        g_g = np.where((lam_g <= 0) & (g_g < 0), 0.0, g_g)
        norm = float(g_c @ g_c + g_g @ g_g)
        if norm <= 1e-12:
            attempt(rc, None)
            break
        best_obj = min(r[0] for r in greedy_results)
        step = theta * max(best_obj - bound, 1e-6 * max(1.0, abs(best_obj))) / norm
        lam_c = np.maximum(0.0, lam_c + step * g_c)
        lam_g = np.maximum(0.0, lam_g + step * g_g)
        if it % repair_every == 0:
            attempt(rc, None)
    attempt(arr.cost + best_lam[0][arr.pool] * arr.cpu + best_lam[1][arr.pool] * arr.gpu, None)
    best_choice: list[int] | None = None
    best_obj = math.inf
    keep = polish if polish is not None else (10 if n < 1000 else 2)
    for _, choice, job_order in sorted(greedy_results, key=lambda r: r[0])[:keep]:
        st.reset()
        for j, c in enumerate(choice):
            if c >= 0:
                st.move(j, c)
        st.place_unplaced(max_scan)
        st.local_search(job_order, max_passes, max_scan)
        st.place_unplaced(max_scan)
        obj = st.objective()
        if obj < best_obj - 1e-9:
            best_obj, best_choice = obj, list(st.choice)
    assert best_choice is not None
    return _finish(jobs, arr, best_choice, penalty, "lagrangian", t0, lower_bound_usd=max(best_bound, 0.0))


def _model(arr: _Arrays, n: int, penalty: float, *, integer: bool) -> tuple[Any, np.ndarray]:
    """The HiGHS model (columns: candidates, then one unplaced slack per job) and each candidate's job."""
    import highspy

    nc = len(arr.cost)
    finite_cpu = np.isfinite(arr.cap_cpu) & (np.bincount(arr.pool, weights=arr.cpu, minlength=len(arr.pools))
                                             > arr.cap_cpu + _EPS)
    finite_gpu = np.isfinite(arr.cap_gpu) & (np.bincount(arr.pool, weights=arr.gpu, minlength=len(arr.pools))
                                             > arr.cap_gpu + _EPS)
    cpu_row = np.full(len(arr.pools), -1, dtype=np.int64)
    gpu_row = np.full(len(arr.pools), -1, dtype=np.int64)
    n_cpu, n_gpu = int(finite_cpu.sum()), int(finite_gpu.sum())
    cpu_row[finite_cpu] = n + np.arange(n_cpu)
    gpu_row[finite_gpu] = n + n_cpu + np.arange(n_gpu)
    rows = n + n_cpu + n_gpu
    job_of = np.repeat(np.arange(n), np.diff(arr.start))
    c_cpu_row = cpu_row[arr.pool]
    c_gpu_row = gpu_row[arr.pool]
    has_cpu = (c_cpu_row >= 0) & (arr.cpu > 0)
    has_gpu = (c_gpu_row >= 0) & (arr.gpu > 0)
    per_col = 1 + has_cpu.astype(np.int64) + has_gpu.astype(np.int64)
    col_start = np.zeros(nc + n + 1, dtype=np.int64)
    col_start[1 : nc + 1] = np.cumsum(per_col)
    col_start[nc + 1 :] = col_start[nc] + np.arange(1, n + 1)
    nnz = int(col_start[-1])
    index = np.empty(nnz, dtype=np.int32)
    value = np.empty(nnz, dtype=float)
    pos = col_start[:nc]
    index[pos] = job_of
    value[pos] = 1.0
    nxt = pos + 1
    index[nxt[has_cpu]] = c_cpu_row[has_cpu]
    value[nxt[has_cpu]] = arr.cpu[has_cpu]
    nxt = nxt + has_cpu.astype(np.int64)
    index[nxt[has_gpu]] = c_gpu_row[has_gpu]
    value[nxt[has_gpu]] = arr.gpu[has_gpu]
    index[col_start[nc:-1]] = np.arange(n)
    value[col_start[nc:-1]] = 1.0

    lp = highspy.HighsLp()
    lp.num_col_ = nc + n
    lp.num_row_ = rows
    lp.col_cost_ = np.concatenate([arr.cost, np.full(n, penalty)])
    lp.col_lower_ = np.zeros(nc + n)
    lp.col_upper_ = np.ones(nc + n)
    row_upper = np.ones(rows)
    row_lower = np.full(rows, -highspy.kHighsInf)
    row_lower[:n] = 1.0
    row_upper[cpu_row[finite_cpu]] = arr.cap_cpu[finite_cpu]
    row_upper[gpu_row[finite_gpu]] = arr.cap_gpu[finite_gpu]
    lp.row_lower_ = row_lower
    lp.row_upper_ = row_upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = col_start.astype(np.int32)
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.a_matrix_.num_col_ = nc + n
    lp.a_matrix_.num_row_ = rows
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * nc + [highspy.HighsVarType.kContinuous] * n
    return lp, job_of


def _highs(lp: Any, *, time_limit_seconds: float, threads: int, mip_rel_gap: float = 1e-6) -> Any:
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_seconds))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", int(threads))
    h.passModel(lp)
    h.run()
    return h


def solve_lp_round(
    jobs: Sequence[BatchJob],
    capacity: Mapping[str, PoolCapacity],
    *,
    penalty_usd: float | None = None,
    max_passes: int = 2,
    max_scan: int = 32,
    max_rounds: int = 400,
    dive: int = 4,
    full_search_below: int = 2500,
) -> BatchResult:
    """LP relaxation (HiGHS simplex) rounded to an assignment; the LP optimum is reported as
    ``lower_bound_usd``, so ``gap`` bounds how far from optimal the answer can be.

    Design choice: a basic optimal solution of this LP has at most one fractional job per capacity row
    (pool x resource), so nearly every job is already integral; only those few are rounded (largest LP
    weight first, then cheapest with room) and polished with a short local search.
    """
    import highspy

    t0 = time.perf_counter()
    penalty = default_penalty(jobs) if penalty_usd is None else penalty_usd
    arr = _Arrays(jobs, capacity)
    n = len(jobs)
    if n == 0:
        return _finish(jobs, arr, [], penalty, "lp-round", t0)
    st = _State(arr, n, penalty)
    pool_names = arr.pools
    remaining = list(range(n))
    weight: dict[int, float] = {}
    bound: float | None = None
    for _ in range(max_rounds):
        sub = [jobs[j] for j in remaining]
        caps = {p: PoolCapacity(max(0.0, st.left_cpu[i]), max(0.0, st.left_gpu[i])) for i, p in enumerate(pool_names)}
        sub_arr = _Arrays(sub, caps)
        lp, sub_job_of = _model(sub_arr, len(sub), penalty, integer=False)
        h = _highs(lp, time_limit_seconds=60.0, threads=1)
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        x = np.asarray(h.getSolution().col_value)[: len(sub_arr.cost)]
        if bound is None:
            bound = float(h.getInfo().objective_function_value)
        # sub candidate k of local job i is global candidate start[remaining[i]] + (k - sub_start[i])
        glob = arr.start[np.asarray(remaining)][sub_job_of] + (np.arange(len(x)) - sub_arr.start[sub_job_of])
        weight = {int(g): float(v) for g, v in zip(glob.tolist(), x.tolist(), strict=True) if v > 1e-7}
        order_idx = np.argsort(-x, kind="stable")
        fixed_any = False
        fractional_fixed = 0
        for k in order_idx.tolist():
            v = float(x[k])
            if v <= 1e-7:
                break
            if v < 1 - 1e-7:
                if fractional_fixed >= dive:
                    continue
            j = remaining[int(sub_job_of[k])]
            c = int(glob[k])
            if st.choice[j] < 0 and st.fits(c):
                st.move(j, c)
                fixed_any = True
                fractional_fixed += v < 1 - 1e-7
        remaining = [j for j in remaining if st.choice[j] < 0]
        if not fixed_any or len(remaining) <= 1:
            break
    if bound is None:
        return solve_lagrangian(jobs, capacity, penalty_usd=penalty)
    rest = list(remaining)
    rest.sort(key=lambda j: (-max((weight.get(c, 0.0) for c in st.by_cost[j]), default=0.0), j))
    for j in rest:
        for c in sorted(st.by_cost[j], key=lambda c: (-weight.get(c, 0.0), st.cost[c])):
            if st.fits(c):
                st.move(j, c)
                break
    st.place_unplaced(max_scan)
    st.local_search(list(range(n)) if n <= full_search_below else rest, max_passes, max_scan)
    result = _finish(jobs, arr, st.choice, penalty, "lp-round", t0, status="heuristic", lower_bound_usd=bound)
    rel = (result.objective_usd - bound) / max(abs(result.objective_usd), 1e-9)
    return replace(result, gap=max(0.0, rel))


def solve_heuristic(
    jobs: Sequence[BatchJob],
    capacity: Mapping[str, PoolCapacity],
    *,
    penalty_usd: float | None = None,
    both_below: int = 500,
) -> BatchResult:
    """The scheduler's fast batch placement: :func:`solve_lp_round` (LP relaxation with HiGHS, diving,
    local search), and for batches under ``both_below`` jobs also :func:`solve_lagrangian`; the cheaper
    answer wins. Without ``highspy`` only the Lagrangian heuristic runs. Never breaks a capacity limit."""
    t0 = time.perf_counter()
    try:
        import highspy  # noqa: F401
    except ImportError:
        return solve_lagrangian(jobs, capacity, penalty_usd=penalty_usd)
    best = solve_lp_round(jobs, capacity, penalty_usd=penalty_usd)
    if len(jobs) < both_below:
        other = solve_lagrangian(jobs, capacity, penalty_usd=penalty_usd)
        if other.objective_usd < best.objective_usd - 1e-9:
            best = replace(other, lower_bound_usd=best.lower_bound_usd)
    bound = best.lower_bound_usd
    rel = None if bound is None else max(0.0, (best.objective_usd - bound) / max(abs(best.objective_usd), 1e-9))
    return replace(best, seconds=time.perf_counter() - t0, gap=rel)


def solve_exact(
    jobs: Sequence[BatchJob],
    capacity: Mapping[str, PoolCapacity],
    *,
    penalty_usd: float | None = None,
    time_limit_seconds: float = 60.0,
    mip_rel_gap: float = 1e-6,
    threads: int = 1,
) -> BatchResult:
    """Solve the mixed-integer model with HiGHS. ``status`` is ``optimal`` or ``time_limit`` (then the
    best solution found, with ``gap`` from the dual bound); ``RuntimeError`` when HiGHS found no solution."""
    import highspy

    t0 = time.perf_counter()
    penalty = default_penalty(jobs) if penalty_usd is None else penalty_usd
    arr = _Arrays(jobs, capacity)
    n = len(jobs)
    nc = len(arr.cost)
    lp, job_of = _model(arr, n, penalty, integer=True)
    h = _highs(lp, time_limit_seconds=time_limit_seconds, threads=threads, mip_rel_gap=mip_rel_gap)
    status = h.getModelStatus()
    info = h.getInfo()
    x = np.asarray(h.getSolution().col_value)
    if len(x) < nc + n or info.primal_solution_status == 0:
        raise RuntimeError(f"HiGHS found no solution ({h.modelStatusToString(status)}) in {time_limit_seconds} s")
    choice = [-1] * n
    for c in np.flatnonzero(x[:nc] > 0.5).tolist():
        choice[int(job_of[c])] = c
    name = h.modelStatusToString(status)
    label = "optimal" if status == highspy.HighsModelStatus.kOptimal else (
        "time_limit" if status == highspy.HighsModelStatus.kTimeLimit else name)
    bound = float(info.mip_dual_bound)
    result = _finish(jobs, arr, choice, penalty, "highs", t0, status=label, lower_bound_usd=bound)
    rel = (result.objective_usd - bound) / max(abs(result.objective_usd), 1e-9)
    return replace(result, gap=max(0.0, rel))


def evaluate(
    jobs: Sequence[BatchJob], capacity: Mapping[str, PoolCapacity], assignment: Mapping[str, int | None]
) -> list[str]:
    """Violations of ``assignment`` (capacity overruns, unknown candidates); empty when feasible."""
    problems = []
    used: dict[str, list[float]] = {}
    for job in jobs:
        k = assignment.get(job.id)
        if k is None:
            continue
        if not 0 <= k < len(job.candidates):
            problems.append(f"{job.id}: candidate {k} does not exist")
            continue
        c = job.candidates[k]
        u = used.setdefault(c.pool, [0.0, 0.0])
        u[0] += c.vcpus
        u[1] += c.gpus
    for p, (ucpu, ugpu) in sorted(used.items()):
        cap = capacity.get(p, PoolCapacity())
        if ucpu > cap.vcpus + 1e-6:
            problems.append(f"{p}: {ucpu:g} vCPUs used of {cap.vcpus:g}")
        if ugpu > cap.gpus + 1e-6:
            problems.append(f"{p}: {ugpu:g} GPUs used of {cap.gpus:g}")
    return problems


def gap(heuristic: BatchResult, reference: BatchResult) -> float:
    """Relative excess of ``heuristic``'s objective over ``reference``'s (0.01 = 1 % worse)."""
    return (heuristic.objective_usd - reference.objective_usd) / max(abs(reference.objective_usd), 1e-9)
