"""Collective matmul as loops (issue 25): the permute ring is one loop over its steps, so the
program does not grow with the axis size, and an all-gather of a dot's contracting dim
becomes a ring too (each step multiplies the block it holds and adds it up).

Values are compared with the unpartitioned dot on 8 CPU devices; sizes (never times) of
``plan.lower_text()`` on abstract meshes of 8 and 256 devices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import assert_same, rand

P = gp.P
S = jax.ShapeDtypeStruct

# (name, in_shardings, out_shardings): an all-gather of a free dim, a reduce-scatter, an
# all-gather of the contracting dim, each feeding (fed by) the dot
FORMS = [
    ("all-gather-free", (P("x", None), P(None, "x")), P(None, "x")),
    ("reduce-scatter", (P(None, "x"), P("x", None)), P("x", None)),
    ("all-gather-contracting", (P("x", None), P("x", None)), P("x", None)),
]


def matmul(a, b):
    return a @ b


def ring_collectives(plan):
    """The dot's collectives (an uneven result's boundary gather aside)."""
    return [(c.kind, c.in_loop) for c in plan.collectives if c.op != "boundary"]


@pytest.mark.parametrize("name,ins,outs", FORMS, ids=[f[0] for f in FORMS])
def test_ring_program_size_is_flat_in_the_axis_size(name, ins, outs):
    """At 256 devices the unrolled ring was 0.5-1 GiB of StableHLO; as a loop the text grows
    only by the permute's pair list."""
    sizes = {}
    for n in (8, 256):
        mesh = gp.Mesh.abstract((n,), ("x",))
        f = gp.spmd(matmul, mesh, in_shardings=ins, out_shardings=outs, collective_matmul_bytes=0)
        plan = f.plan(S((1024, 512), jnp.float32), S((512, 1024), jnp.float32))
        assert ring_collectives(plan) == [("collective-permute", True)], [str(c) for c in plan.collectives]
        sizes[n] = len(plan.lower_text())
    assert sizes[256] <= 4 * sizes[8], sizes


@pytest.mark.parametrize("name,ins,outs", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("m,k", [(32, 64), (30, 66)])
def test_ring_loops_compute_the_dot_on_8_devices(name, ins, outs, m, k):
    a, b = rand((m, k)), rand((k, 24), seed=1)
    f = gp.spmd(matmul, gp.Mesh((8,), ("x",)), in_shardings=ins, out_shardings=outs, collective_matmul_bytes=0)
    assert ring_collectives(f.plan(a, b)) == [("collective-permute", True)]
    assert_same(f(a, b), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh,axis", [(gp.Mesh((4,), ("x",), devices=list(range(4))), "x"),
                                       (gp.Mesh((2, 4), ("x", "y")), "y"),
                                       (gp.Mesh((4, 2), ("x", "y")), ("x", "y")),
                                       (gp.Mesh((2, 2, 2), ("x", "y", "z")), ("z", "x"))])
@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.int32])
@pytest.mark.parametrize("k", [16, 13])
def test_contracting_dim_all_gather_feeding_a_dot_is_a_permute_loop(mesh, axis, dtype, k):
    """``a @ b``, ``a``'s rows and ``b``'s rows (the contracting dim) sharded: the plain
    program all-gathers ``b``; under collective_matmul_bytes=0 it is a ring of permutes of
    ``b``'s block, each step multiplying the block it holds with ``a``'s matching columns."""
    a = rand((12, k), dtype, seed=2)
    b = rand((k, 10), dtype, seed=3)
    if dtype == np.int32:
        a, b = a.astype(np.int32), b.astype(np.int32)
    ins = (P(axis, None), P(axis, None))
    plain = gp.spmd(matmul, mesh, in_shardings=ins).plan(a, b)
    assert {c.kind for c in plain.collectives} == {"all-gather"}
    f = gp.spmd(matmul, mesh, in_shardings=ins, collective_matmul_bytes=0)
    plan = f.plan(a, b)
    assert ring_collectives(plan) == [("collective-permute", True)], [str(c) for c in plan.collectives]
    assert "partial dots accumulated" in plan.report()
    got, want = f(a, b), jnp.matmul(a, b)
    assert got.dtype == want.dtype
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    assert_same(got.astype(np.float32), want.astype(np.float32), rtol=tol, atol=tol)


def test_contracting_ring_under_grad_matches():
    """The ring sits inside a differentiated program: gradients match the plain ones."""
    a, b = rand((16, 24)), rand((24, 8), seed=1)
    loss = lambda a, b: jnp.sum(jnp.tanh(a @ b))  # noqa: E731
    g = jax.grad(loss, argnums=(0, 1))
    f = gp.spmd(g, gp.Mesh((8,), ("x",)), in_shardings=(P("x", None), P("x", None)), collective_matmul_bytes=0)
    assert_same(f(a, b), g(a, b), rtol=1e-4, atol=1e-4)
