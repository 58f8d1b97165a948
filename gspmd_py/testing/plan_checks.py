"""``assert_plan``: properties of a plan, checked without running anything (abstract meshes of
thousands of devices plan in seconds).

    mesh = gp.Mesh.abstract((64, 128), ("data", "model"))
    gpt.assert_plan(step, params, batch, mesh=mesh, in_shardings=specs,
                    max_collective_bytes=256 * 2**20,           # no single collective sends more per device
                    no_fallback=True,                           # no op fell back to a replicated computation
                    max_peak_bytes=16 * 2**30,                  # predicted peak memory per device
                    collectives_at_most={"all-gather": 4, "all-to-all": 0})   # or an int: all kinds together

Arguments may be arrays or jax.ShapeDtypeStructs. Returns the plan; a violated property is an
AssertionError naming each offending collective or op (with the op that caused it) and ending
with ``plan.report()``.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Optional, Union

import jax
import numpy as np

from ..api.api import spmd
from ..core.errors import ArgumentError, ArgumentTypeError
from ..core.mesh import Mesh
from ..ops.collectives import KINDS as COLLECTIVE_KINDS
from ..views.plan_check import Finding, check_plan

__all__ = ["Finding", "assert_plan", "check_plan"]

KINDS = tuple(COLLECTIVE_KINDS)


def _abstract(a):
    if isinstance(a, jax.ShapeDtypeStruct):
        return a
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)
    x = np.asarray(a)
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _size(n: int) -> str:
    for unit, k in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


def assert_plan(fn, *args, mesh: Mesh, in_shardings: Any = None, out_shardings: Any = None,
                max_collective_bytes: Optional[int] = None, no_fallback: bool = False,
                max_peak_bytes: Optional[int] = None,
                collectives_at_most: Union[None, int, Mapping[str, int]] = None, hardware=None, **spmd_kwargs):
    """Plan ``fn`` on ``mesh`` (module doc) and assert the given properties; returns the plan.

    ``max_collective_bytes``: the largest bytes_per_device of any one collective (a collective
    in a loop counts once per iteration: its bytes are per run). ``max_peak_bytes``: the cost
    model's predicted peak memory per device (``plan.cost(hardware).peak_memory_bytes``;
    hardware defaults to the "h100-node" preset: the peak does not depend on it).
    ``collectives_at_most``: an int (all collectives) or a mapping kind -> count.
    """
    if not isinstance(mesh, Mesh):
        raise ArgumentTypeError(f"assert_plan: mesh must be a gp.Mesh (gp.Mesh.abstract for planning at scale), "
                                f"got {mesh!r}")
    for what, limit in (("max_collective_bytes", max_collective_bytes), ("max_peak_bytes", max_peak_bytes)):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0):
            raise ArgumentError(f"assert_plan: {what} must be a non-negative number of bytes or None, got {limit!r}")
    if isinstance(collectives_at_most, Mapping):
        unknown = sorted(set(collectives_at_most) - set(KINDS))
        if unknown:
            raise ArgumentError(f"assert_plan: collectives_at_most names unknown kinds {unknown}; kinds: {list(KINDS)}")
    abstract_args = jax.tree_util.tree_map(_abstract, args)
    f = spmd(fn, mesh, in_shardings=in_shardings, out_shardings=out_shardings, **spmd_kwargs)
    plan = f.plan(*abstract_args)
    problems = []
    colls = plan.collectives
    if max_collective_bytes is not None:
        for c in colls:
            if c.bytes_per_device > max_collective_bytes:
                problems.append(f"{c.kind}({','.join(c.axes)}) sends {_size(c.bytes_per_device)} per device "
                                f"(limit {_size(max_collective_bytes)}), caused by {c.op}")
    if no_fallback:
        for fb in plan.fallbacks:
            problems.append(f"replicated fallback: {fb.op}: {fb.reason}")
    if collectives_at_most is not None:
        counts = Counter(c.kind for c in colls)
        limits = {"all kinds": collectives_at_most} if isinstance(collectives_at_most, int) else dict(collectives_at_most)
        for kind, limit in limits.items():
            n = sum(counts.values()) if kind == "all kinds" else counts.get(kind, 0)
            if n > limit:
                which = [str(c) for c in colls if kind == "all kinds" or c.kind == kind]
                problems.append(f"{n} collectives ({kind}) > {limit}: " + "; ".join(which[:8])
                                + (" ..." if len(which) > 8 else ""))
    if max_peak_bytes is not None:
        from ..cost import Hardware

        peak = plan.cost(hardware or Hardware.preset("h100-node")).peak_memory_bytes
        if peak > max_peak_bytes:
            problems.append(f"predicted peak memory {_size(peak)} per device > {_size(max_peak_bytes)}")
    if problems:
        raise AssertionError(f"the plan of {getattr(fn, '__name__', 'fn')} on {mesh}:\n  " + "\n  ".join(problems)
                             + "\n" + plan.report())
    return plan
