"""Partial values reduced exactly once through chains of layouts (issue 16).

A partial sum that changed layout and then landed on its own partial axis was reduced
twice (x8 on an 8-device axis): the op that kept it partial had its operand
reduce-scattered by the reshard and then marked its result partial again. Each case
below equals jax.jit with the same shardings and has exactly one reduction collective
per partial value; the layout-chain validator (layout_chains.py) runs a stratified
sample here and its full sweep with GSPMD_PY_SWEEP=1 (GSPMD_PY_SWEEP_SHARD=i/n runs the
i-th of n slices; GSPMD_PY_SWEEP_REPORT=path writes the counts and every mismatch).
"""
from __future__ import annotations

import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
import layout_chains as chains
from partition_util import assert_same, jit_sharded

P = gp.P
REDUCING = ("all-reduce", "reduce-scatter")


def reductions(plan, reduce: str = "sum") -> list:
    return [c for c in plan.collectives if c.kind in REDUCING and c.reduce == reduce]


def compare(fn, mesh, args, in_specs, out_specs=None, *, xla_ok=True):
    """gp.spmd(fn) equals fn and (``xla_ok``: XLA's CPU max/min all-reduce drops NaN) jax.jit(fn)
    with the same shardings; returns the plan."""
    f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=out_specs)
    got = f(*args)
    assert_same(got, fn(*args), rtol=1e-5, atol=1e-5)
    jit_out = [out_specs] if isinstance(out_specs, gp.P) else out_specs
    if xla_ok:
        assert_same(got, jit_sharded(fn, mesh, args, in_specs, jit_out), rtol=1e-5, atol=1e-5)
    return f.plan(*args)


def ints(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_smallest_case_replicate_then_shard_the_partial_axis(dtype):
    mesh = gp.Mesh((8,), ("data",))

    def f(x):
        return gp.annotate(gp.annotate(x.sum(0), P(None)), P("data"))

    plan = compare(f, mesh, (ints((16, 8), dtype=dtype),), (P("data", None),))
    (red,) = reductions(plan)
    assert red.kind == "reduce-scatter" and red.axes == ("data",)


def test_out_shardings_onto_the_partial_axis():
    mesh = gp.Mesh((8,), ("data",))

    def f(x):
        return gp.annotate(x.sum(0) * 2.0, P(None))

    plan = compare(f, mesh, (ints((16, 13)),), (P("data", None),), P("data"))
    assert len(reductions(plan)) == 1


def test_megatron_then_sequence_parallel():
    """A Megatron MLP's output (partial over y) annotated batch-sharded, scaled, then
    annotated sequence-parallel over y: one reduce-scatter over y, nothing else."""
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def block(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        out = gp.annotate(h @ w2, P("x", None, None))
        out = out * 0.5
        return gp.annotate(out, P("x", "y", None))

    args = (ints((4, 8, 16), 1), ints((16, 32), 2), ints((32, 16), 3))
    plan = compare(block, mesh, args, (P("x", None, None), P(None, "y"), P("y", None)))
    (red,) = reductions(plan)
    assert (red.kind, red.axes) == ("reduce-scatter", ("y",))
    assert [c.kind for c in plan.collectives] == ["reduce-scatter"]


def test_zero_update_through_replicate_then_shard():
    """A data-parallel gradient (partial over x) replicated, then sharded over x for a
    ZeRO-style update of x-sharded weights: one reduce-scatter."""
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def step(w, x, dy):
        g = x.T @ dy  # contracts the x-sharded batch: partial over x
        g = gp.annotate(g, P(None, None))
        g = gp.annotate(g, P("x", None))
        return w - 0.25 * g

    args = (ints((12, 6), 1), ints((16, 12), 2), ints((16, 6), 3))
    plan = compare(step, mesh, args, (P("x", None), P("x", None), P("x", None)), P("x", None))
    assert len(reductions(plan)) == 1
    assert [c.kind for c in plan.collectives] == ["reduce-scatter"]


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_partials_through_a_chain(op):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    red = getattr(jnp, op)

    def f(x):
        v = gp.annotate(red(x, axis=0), P(None, None))
        return gp.annotate(v, P("y", "x"))

    x = ints((8, 7, 5))
    x[3, 2, 1] = np.nan
    x[1, 0, 0] = -np.inf
    compare(f, mesh, (x,), (P(("x", "y"), None, None),), xla_ok=False)


def test_add_of_two_partials_lands_on_its_axis():
    mesh = gp.Mesh((2, 2, 2), ("x", "y", "z"))

    def f(a, b):
        s = gp.annotate(a.sum(0), P(None, None)) + gp.annotate(b.sum(0), P(None, None))
        return gp.annotate(-s, P(None, ("y", "z")))

    plan = compare(f, mesh, (ints((8, 3, 8), 1), ints((8, 3, 8), 2)), (P(("y", "z"), None, None),) * 2)
    assert len(reductions(plan)) == 1


# -- the validator --------------------------------------------------------------------------------

SAMPLE_STRIDE = 587  # about 180 chains of the sweep's 106,428, spread over meshes, shapes, starts


def sample() -> list:
    return list(itertools.islice(chains.sweep(), 0, None, SAMPLE_STRIDE))


def batches(items: list, size: int = 20):
    by_mesh: dict = {}
    for c in items:
        by_mesh.setdefault(c.mesh, []).append(c)
    for group in by_mesh.values():
        for i in range(0, len(group), size):
            yield group[i:i + size]


@pytest.mark.slow
def test_chain_sample():
    items = sample()
    assert len(items) > 150
    kinds = {c.start[0] for c in items} | {c.start[1] for c in items if c.start[0] == "partial"}
    assert kinds >= {"replicated", "sharded", "partial", "sum", "max", "min", "pick"}
    bad = [m for b in batches(items) for m in chains.run_batch(b)]
    assert not bad, "\n".join(bad[:10])


def test_the_issue_chain_fails_when_reduced_twice():
    """The validator sees a double reduction: the issue's smallest case is in the sweep and
    a doubled result is not accepted (a run_batch of the chain passes; its check compares
    values exactly)."""
    c = chains.Chain(0, (4, 8), ("partial", "sum", ("x",)), (("annotate", P(None, None)), ("annotate", P("x", None))))
    assert c in set(itertools.islice(chains.chains(0, (2,), ((4, 8),)), 0, None))
    assert chains.run_batch([c]) == []
    x, y, i = c.args(0)
    assert not np.array_equal(8 * np.asarray(c.run(x, y, i)), np.asarray(c.run(x, y, i)))


@pytest.mark.skipif(not os.environ.get("GSPMD_PY_SWEEP"), reason="the full sweep: GSPMD_PY_SWEEP=1")
def test_chain_sweep():
    items = list(chains.sweep())
    shard = os.environ.get("GSPMD_PY_SWEEP_SHARD", "0/1")
    i, n = (int(v) for v in shard.split("/"))
    items = items[i::n]
    bad, done = [], 0
    for b in batches(items):
        bad += chains.run_batch(b)
        done += len(b)
    path = os.environ.get("GSPMD_PY_SWEEP_REPORT")
    if path:
        with open(path, "w") as fh:
            json.dump({"chains": done, "mismatches": len(bad), "first": bad[:50]}, fh, indent=1)
    assert not bad, f"{len(bad)} of {done} chains differ:\n" + "\n".join(bad[:10])


@pytest.mark.slow
@pytest.mark.parametrize("mesh_i", [0, 1, 2])
@pytest.mark.parametrize("n", [8, 13])
def test_slices_and_zero_pads_carry_a_partial_sum(mesh_i, n):
    """slice and pad-with-zeros are linear: a partial sum passes through them (the transposes of
    slicing in a gradient) and is reduced once, where it is needed whole."""
    shape, names = chains.SWEEP_MESHES[mesh_i]
    mesh = gp.Mesh(shape, names)
    ax = names[-1]

    def f(x):
        s = x.sum(0)  # partial over ax
        y = jax.lax.pad(s[1:-1], jnp.zeros((), s.dtype), [(2, 1, 0), (0, 0, 0)])
        return gp.annotate(y * 2.0, P(None, None))

    x = ints((16, n, 5))
    x[3, 1, 2] = -0.0
    plan = compare(f, mesh, (x,), (P(ax, None, None),))
    assert len(reductions(plan)) == 1, plan.report()
    assert not [c for c in plan.collectives if c.kind == "all-gather"], plan.report()
