"""Solve the exact search's problem (ilp_build.py) as a MILP with HiGHS (scipy.optimize.milp),
as Alpa and XLA's auto-sharding do:

* per node a one-hot choice ``x[n, i]`` (binary);
* per block (a, b) a pair variable ``e[i, j]`` (continuous in [0, 1]) with ``sum_j e[i, j] =
  x[a, i]`` and ``sum_i e[i, j] = x[b, j]``: the pair the two nodes chose (integral whenever
  the x are), carrying the block's pairwise cost;
* per latency group ``u[g]`` in [0, 1] at least every entry that issues one of its collectives
  (its latency once, as the combiner issues such collectives together);
* memory: the arguments' and outputs' local bytes (the tables' bound of the peak) at most the limit;
* minimise the summed seconds (in microseconds, for the solver's tolerances).

The work budget is HiGHS's branch-and-bound node count (``node_limit``: deterministic); the
wall-clock ``time_limit`` is a safety cap only. ``fix``: per node the allowed choices (the
user's fixed values; a test pins a hand plan).
"""
from __future__ import annotations

import time
from typing import Optional

import attrs
import numpy as np

from .ilp_build import Problem

SCALE = 1e6  # seconds -> microseconds
NODE_LIMIT = 500  # branch-and-bound nodes: the default work budget
MAX_VARIABLES = 40_000  # a larger problem is left to the fallback search (its LP alone takes seconds to minutes)


@attrs.frozen
class Solution:
    status: str  # "optimal", "nodes" (the node budget stopped it), "time" (the cap), "infeasible", "too large"
    choice: Optional[tuple[int, ...]]  # per node the chosen index (None: no solution)
    objective_s: float  # the solved cost in seconds (inf: none)
    bound_s: float  # the solver's lower bound in seconds
    variables: int
    constraints: int
    nodes: int
    seconds: float  # CPU seconds (the machine's load does not count)


def solve(p: Problem, memory_limit: Optional[float] = None, fix: Optional[dict] = None,
          node_limit: int = NODE_LIMIT, time_limit: float = 60.0) -> Solution:
    from scipy.optimize import LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0, c0 = time.perf_counter(), time.process_time()
    nvars = p.variables + len(p.alpha)
    if p.variables > MAX_VARIABLES:
        return Solution("too large", None, float("inf"), 0.0, nvars, 0, 0, 0.0)
    off = []
    k = 0
    for ch in p.choices:
        off.append(k)
        k += len(ch)
    n_x = k
    boff = []
    for b in p.blocks:
        boff.append(k)
        k += b.cost.size
    soff = []
    for sh in p.shared:
        soff.append(k)
        k += sh.cost.size
    uoff = k
    n = k + len(p.alpha)
    c = np.zeros(n)
    for i, cost in enumerate(p.cost):
        c[off[i]:off[i] + len(cost)] = cost
    for bi, b in enumerate(p.blocks):
        c[boff[bi]:boff[bi] + b.cost.size] = b.cost.reshape(-1)
    for si, sh in enumerate(p.shared):
        c[soff[si]:soff[si] + sh.cost.size] = sh.cost.reshape(-1)
    c[uoff:] = p.alpha
    c *= SCALE
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def row(idx, coef, a, b) -> None:
        nonlocal r
        rows.extend([r] * len(idx))
        cols.extend(idx)
        vals.extend(coef)
        lo.append(a)
        hi.append(b)
        r += 1

    for i, ch in enumerate(p.choices):  # one-hot
        row(list(range(off[i], off[i] + len(ch))), [1.0] * len(ch), 1.0, 1.0)
    for bi, b in enumerate(p.blocks):  # pair marginals
        na, nb = b.cost.shape
        base = boff[bi]
        for i in range(na):
            row([base + i * nb + j for j in range(nb)] + [off[b.a] + i], [1.0] * nb + [-1.0], 0.0, 0.0)
        for j in range(nb):
            row([base + i * nb + j for i in range(na)] + [off[b.b] + j], [1.0] * na + [-1.0], 0.0, 0.0)
        for g, m in b.masks:  # u[g] >= the pairs that issue the group's collective
            hit = np.flatnonzero(m.reshape(-1))
            if len(hit):
                row([base + int(h) for h in hit] + [uoff + g], [1.0] * len(hit) + [-1.0], -np.inf, 0.0)
    for si, sh in enumerate(p.shared):  # w[l, t] >= the pairs (l, s) of a reader whose strategy s reads target t
        nt = sh.cost.shape[1]
        for bi, tid in sh.uses:
            b = p.blocks[bi]
            nb = b.cost.shape[1]
            for t in sorted(set(tid.tolist())):
                ss = np.flatnonzero(tid == t)
                for i in range(b.cost.shape[0]):
                    row([boff[bi] + i * nb + int(j) for j in ss] + [soff[si] + i * nt + t], [1.0] * len(ss) + [-1.0],
                        -np.inf, 0.0)
        for g, m in sh.masks:  # u[g] >= each reshard that issues the group's collective
            for h in np.flatnonzero(m.reshape(-1)):
                row([soff[si] + int(h), uoff + g], [1.0, -1.0], -np.inf, 0.0)
    for i, ms in enumerate(p.masks):
        for g, m in ms:
            hit = np.flatnonzero(m)
            if len(hit):
                row([off[i] + int(h) for h in hit] + [uoff + g], [1.0] * len(hit) + [-1.0], -np.inf, 0.0)
    if memory_limit is not None:
        idx = [off[i] + j for i, mem in enumerate(p.memory) for j in range(len(mem)) if mem[j]]
        coef = [float(p.memory[i][j]) / 2 ** 20 for i, mem in enumerate(p.memory) for j in range(len(mem)) if mem[j]]
        if idx:
            row(idx, coef, -np.inf, float(memory_limit) / 2 ** 20)
    ub = np.ones(n)
    allowed = dict(p.fixed)
    for node, ok in (fix or {}).items():
        allowed[node] = tuple(sorted(set(allowed.get(node, ok)) & set(ok)))
    for node, ok in allowed.items():
        mask = np.zeros(len(p.choices[node]))
        mask[list(ok)] = 1.0
        ub[off[node]:off[node] + len(mask)] = mask
    a = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
    integrality = np.zeros(n)
    integrality[:n_x] = 1
    from scipy.optimize import Bounds

    res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(n), ub), constraints=LinearConstraint(a, lo, hi),
               options={"node_limit": int(node_limit), "time_limit": float(time_limit), "disp": False,
                        "presolve": False})
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    nodes = int(getattr(res, "mip_node_count", 0) or 0)
    bound = float(getattr(res, "mip_dual_bound", np.nan) or np.nan) / SCALE
    if res.x is None:
        status = "infeasible" if res.status == 2 else ("time" if secs >= time_limit * 0.98 else "nodes")
        return Solution(status, None, float("inf"), bound, n, r, nodes, cpu)
    x = res.x
    choice = tuple(int(np.argmax(x[off[i]:off[i] + len(ch)])) for i, ch in enumerate(p.choices))
    status = "optimal" if res.status == 0 else ("time" if secs >= time_limit * 0.98 else "nodes")
    return Solution(status, choice, float(res.fun) / SCALE, bound, n, r, nodes, cpu)


def objective(p: Problem, choice) -> float:
    """The problem's cost (seconds) of one choice per node: what the solver minimises."""
    s = sum(float(p.cost[i][c]) for i, c in enumerate(choice))
    used = set()
    for i, ms in enumerate(p.masks):
        used.update(g for g, m in ms if m[choice[i]])
    for b in p.blocks:
        s += float(b.cost[choice[b.a], choice[b.b]])
        used.update(g for g, m in b.masks if m[choice[b.a], choice[b.b]])
    for sh in p.shared:
        ts = {int(tid[choice[p.blocks[bi].b]]) for bi, tid in sh.uses}
        li = choice[sh.node]
        s += sum(float(sh.cost[li, t]) for t in ts)
        used.update(g for g, m in sh.masks for t in ts if m[li, t])
    return s + sum(float(p.alpha[g]) for g in used)
