"""Loops keep their shardings (issue 17): a scan/while/cond's values are projected per
position (Shardy's data-flow edges), so one mesh axis shards any number of carries,
constants and xs/ys slots at once, and a loop runs the collectives the unrolled program
runs per layer, once per iteration (``Collective.in_loop``)."""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import report_problems

P = gp.P
L, B, D, F = 3, 8, 16, 32
MEGATRON = (P("x", None), P(None, None, "y"), P(None, "y", None))  # x [B,d], w1 [L,d,f], w2 [L,f,d]


@pytest.fixture(scope="module")
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


def close(a, b, tol=1e-5):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u, np.float32), np.asarray(v, np.float32), rtol=tol, atol=tol)


def weights(seed=0, l=L, b=B, d=D, f=F, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, d)).astype(dtype)
    w1 = (rng.standard_normal((l, d, f)) * 0.2).astype(dtype)
    w2 = (rng.standard_normal((l, f, d)) * 0.2).astype(dtype)
    return x, w1, w2


def layer(h, a, b):
    return h + jnp.tanh(h @ a) @ b


def scanned(x, w1, w2):
    return lax.scan(lambda h, w: (layer(h, *w), None), x, (w1, w2))[0]


def unrolled(x, w1, w2):
    for i in range(w1.shape[0]):
        x = layer(x, w1[i], w2[i])
    return x


def no_all_gather(plan):
    gathers = [str(c) for c in plan.collectives if c.kind == "all-gather"]
    assert not gathers, gathers
    assert not report_problems(plan), report_problems(plan)  # and the report says what the program holds


def moved(cs):
    """What collectives move: kind, axes, bytes per device (one entry per tensor carried)."""
    return Counter((c.kind, c.axes, c.bytes_per_device // c.tensors) for c in cs for _ in range(c.tensors))


def per_iteration_matches_unrolled(loop_plan, unrolled_plan, n):
    """The loop body's collectives, run n times, move what the unrolled program moves."""
    body = [c for c in loop_plan.collectives if c.in_loop]
    outside = [c for c in loop_plan.collectives if not c.in_loop]
    assert body, loop_plan.report()
    assert not any(c.in_loop for c in unrolled_plan.collectives)
    want = moved(unrolled_plan.collectives)
    got = moved(outside) + Counter({k: v * n for k, v in moved(body).items()})
    # a reduction taken out of the loop moves the n layers' tensors stacked: compare bytes there
    stacked = {(k, a) for k, a, _ in moved(outside)}
    total = lambda m: Counter({(k, a): b * c for (k, a, b), c in m.items() if (k, a) in stacked})  # noqa: E731
    assert total(got) == total(want), (loop_plan.report(), unrolled_plan.report())
    drop = lambda m: Counter({key: c for key, c in m.items() if key[:2] not in stacked})  # noqa: E731
    assert drop(got) == drop(want), (loop_plan.report(), unrolled_plan.report())


# -- point 1: scanned layers, constants, carries, nested loops, branches -------------------------

def test_scanned_megatron_stack_forward(mesh):
    args = weights()
    f = gp.spmd(scanned, mesh, in_shardings=MEGATRON)
    plan = f.plan(*args)
    close(f(*args), jax.jit(scanned)(*args))
    no_all_gather(plan)
    assert [(c.kind, c.axes, c.in_loop) for c in plan.collectives] == [("all-reduce", ("y",), True)]
    assert plan.collectives[0].bytes_per_device == B // 2 * D * 4  # the layer's output, batch-sharded
    per_iteration_matches_unrolled(plan, gp.spmd(unrolled, mesh, in_shardings=MEGATRON).plan(*args), L)


@pytest.mark.slow
def test_scanned_megatron_stack_grad(mesh):
    x, w1, w2 = weights()

    def loss(w1, w2, x, fn):
        return (fn(x, w1, w2) ** 2).sum()

    specs = (MEGATRON[1], MEGATRON[2], MEGATRON[0])
    # the input's gradient too: the transposed scan computes the carry's every iteration
    g_scan = jax.grad(lambda *a: loss(*a, scanned), argnums=(0, 1, 2))
    g_unrolled = jax.grad(lambda *a: loss(*a, unrolled), argnums=(0, 1, 2))
    f = gp.spmd(g_scan, mesh, in_shardings=specs)
    plan = f.plan(w1, w2, x)
    close(f(w1, w2, x), jax.jit(g_scan)(w1, w2, x), 1e-4)
    no_all_gather(plan)
    assert plan.out_shardings == tuple(gp.Sharding(mesh, s) for s in specs)
    # tensor-parallel reductions run in the loop; the weight gradients' data-parallel one once after it
    assert all(c.in_loop == (c.axes != ("x",)) for c in plan.collectives), plan.report()
    per_iteration_matches_unrolled(plan, gp.spmd(g_unrolled, mesh, in_shardings=specs).plan(w1, w2, x), L)


@pytest.mark.slow
def test_training_a_scanned_stack_keeps_the_weights_sharded_as_given(mesh):
    x, w1, w2 = weights(1)

    def step(w1, w2, x):
        g1, g2 = jax.grad(lambda w1, w2: (scanned(x, w1, w2) ** 2).mean(), argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2

    specs = (MEGATRON[1], MEGATRON[2], MEGATRON[0])
    f = gp.spmd(step, mesh, in_shardings=specs)
    plan = f.plan(w1, w2, x)
    out = f(w1, w2, x)
    close(out, jax.jit(step)(w1, w2, x), 1e-4)
    no_all_gather(plan)
    assert plan.out_shardings == plan.in_shardings[:2]
    assert [o.sharding.spec for o in out] == [jax.sharding.PartitionSpec(None, None, "y"),
                                               jax.sharding.PartitionSpec(None, "y", None)]


@pytest.mark.slow
def test_weights_as_loop_constants(mesh):
    x, w1, w2 = weights(2)

    def fori(x, a, b):
        return lax.fori_loop(0, 3, lambda i, h: layer(h, a, b), x)

    def scan_consts(x, a, b):
        return lax.scan(lambda h, _: (layer(h, a, b), h.sum(axis=1)), x, None, length=3)

    specs = (P("x", None), P(None, "y"), P("y", None))
    for fn in (fori, scan_consts):
        f = gp.spmd(fn, mesh, in_shardings=specs)
        plan = f.plan(x, w1[0], w2[0])
        close(f(x, w1[0], w2[0]), jax.jit(fn)(x, w1[0], w2[0]))
        no_all_gather(plan)
        assert [(c.kind, c.axes, c.in_loop) for c in plan.collectives if c.in_loop] == [("all-reduce", ("y",), True)]
        assert sum(c.bytes_per_device for c in plan.collectives if c.in_loop) == B // 2 * D * 4


@pytest.mark.slow
@settings(max_examples=6)
@given(b=st.sampled_from([8, 6, 7]), f=st.sampled_from([32, 12, 30]), t=st.integers(1, 3),
       dtype=st.sampled_from([np.float32, jnp.bfloat16]))
def test_batch_sharded_carry_beside_sharded_per_step_outputs(mesh, b, f, t, dtype):
    """Carry [B,d] over x, xs [T,B,d] over x, ys [T,B,f] over (x, y): no collective at all."""
    rng = np.random.default_rng(b * f + t)
    h0 = rng.standard_normal((b, D)).astype(dtype)
    xs = rng.standard_normal((t, b, D)).astype(dtype)
    w = (rng.standard_normal((D, f)) * 0.2).astype(dtype)

    def fn(h0, xs, w):
        def step(h, x):
            h = jnp.tanh(h * x + x)
            return h, gp.annotate(h @ w, P("x", "y"))
        return lax.scan(step, h0, xs)

    g = gp.spmd(fn, mesh, in_shardings=(P("x", None), P(None, "x", None), P(None, "y")))
    plan = g.plan(h0, xs, w)
    tol = 1e-5 if dtype == np.float32 else 5e-2
    close(g(h0, xs, w), jax.jit(fn)(h0, xs, w), tol)
    # an uneven output leaves the program gathered (a jax.Array divides evenly): at the boundary only
    assert [c for c in plan.collectives if c.op != "boundary" or (b % 2 == 0 and f % 4 == 0)] == [], plan.report()
    assert plan.out_shardings[0] == gp.Sharding(mesh, P("x", None))
    assert plan.out_shardings[1] == gp.Sharding(mesh, P(None, "x", "y"))


@pytest.mark.slow
def test_nested_loops(mesh):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((B, D)).astype(np.float32)
    w1 = (rng.standard_normal((2, 2, D, F)) * 0.2).astype(np.float32)
    w2 = (rng.standard_normal((2, 2, F, D)) * 0.2).astype(np.float32)

    def fn(x, w1, w2):
        def group(h, w):
            return scanned(h, *w), None
        return lax.scan(group, x, (w1, w2))[0]

    specs = (P("x", None), P(None, None, None, "y"), P(None, None, "y", None))
    f = gp.spmd(fn, mesh, in_shardings=specs)
    plan = f.plan(x, w1, w2)
    close(f(x, w1, w2), jax.jit(fn)(x, w1, w2))
    no_all_gather(plan)
    assert [(c.kind, c.axes, c.in_loop) for c in plan.collectives] == [("all-reduce", ("y",), True)]
    g = jax.grad(lambda w1, w2, x: (fn(x, w1, w2) ** 2).sum(), argnums=(0, 1))
    gf = gp.spmd(g, mesh, in_shardings=(specs[1], specs[2], specs[0]))
    close(gf(w1, w2, x), jax.jit(g)(w1, w2, x), 1e-4)
    gplan = gf.plan(w1, w2, x)
    no_all_gather(gplan)
    assert gplan.out_shardings == (gp.Sharding(mesh, specs[1]), gp.Sharding(mesh, specs[2]))


@pytest.mark.slow
@pytest.mark.parametrize("flag", [True, False])
def test_cond_branches_inside_a_scan(mesh, flag):
    x, w1, w2 = weights(4)

    def fn(x, w1, w2, flag):
        def step(h, w):
            return lax.cond(flag, lambda h: layer(h, *w), lambda h: jnp.sin(h) * 2.0, h), None
        return lax.scan(step, x, (w1, w2))[0]

    f = gp.spmd(fn, mesh, in_shardings=MEGATRON + (None,))
    plan = f.plan(x, w1, w2, flag)
    close(f(x, w1, w2, flag), jax.jit(fn)(x, w1, w2, flag))
    no_all_gather(plan)
    assert {(c.kind, c.axes, c.in_loop) for c in plan.collectives} == {("all-reduce", ("y",), True)}


# -- point 3: pipelining the GSPMD way ------------------------------------------------------------

@pytest.mark.slow
@settings(max_examples=8)
@given(n=st.sampled_from([4, 7, 8, 13]), i=st.integers(-13, 14), how=st.sampled_from(["set", "add", "max"]))
def test_updating_one_row_of_a_sharded_dim_is_local(mesh, n, i, how):
    """``state.at[i].set(x)`` with the rows sharded: each device scatters into its own rows
    (out-of-range indices are dropped, as jnp drops them): no collective."""
    rng = np.random.default_rng(n)
    s = rng.standard_normal((n, 6)).astype(np.float32)
    x = rng.standard_normal((6,)).astype(np.float32)

    def fn(s, x):
        return getattr(s.at[i], how)(x)

    f = gp.spmd(fn, mesh, in_shardings=(P("y", None), None), out_shardings=P("y", None))
    plan = f.plan(s, x)
    close(f(s, x), jax.jit(fn)(s, x))
    assert [c for c in plan.collectives if c.op != "boundary" or n % 4 == 0] == [], plan.report()
    assert not report_problems(plan)


STAGES, MICRO, MB, DM = 4, 6, 8, 16
SHIFTS = {  # the state buffer moves one stage on: the forms Praxis and MaxText write
    "pad": lambda s: lax.pad(s, jnp.zeros((), s.dtype), [(1, -1, 0), (0, 0, 0), (0, 0, 0)]),
    "roll": lambda s: jnp.roll(s, 1, axis=0),
    "slice+concatenate": lambda s: jnp.concatenate([s[-1:], s[:-1]], axis=0),
    "pad+slice": lambda s: jnp.pad(s, [(1, 0), (0, 0), (0, 0)])[:-1],
}


def stage(w, h):
    return jnp.tanh(h @ w)


def pipelined(ws, x, shift):
    """GSPMD paper §3.3: stages vmapped over the stage-stacked weights, a state buffer
    [S, mb, d] over "pipe", M + S - 1 iterations; every stage's output is kept, the last
    stage's rows taken after the loop."""
    xs = jnp.concatenate([x, jnp.zeros((STAGES - 1,) + x.shape[1:], x.dtype)])
    state = gp.annotate(jnp.zeros((STAGES,) + x.shape[1:], x.dtype), P("pipe", "data", None))

    def step(state, xt):
        state = state.at[0].set(xt)  # stage 0 takes the next microbatch: a local select
        out = jax.vmap(stage)(ws, state)
        return SHIFTS[shift](out), out

    _, outs = lax.scan(step, state, xs)
    return outs[STAGES - 1:, -1]


def sequential(ws, x):
    for s in range(STAGES):
        x = stage(ws[s], x)
    return x


@pytest.fixture(scope="module")
def pipe_mesh():
    return gp.Mesh((2, 4), ("data", "pipe"))


def pipeline_plan(pipe_mesh, shift):
    rng = np.random.default_rng(7)
    ws = (rng.standard_normal((STAGES, DM, DM)) * 0.3).astype(np.float32)
    x = rng.standard_normal((MICRO, MB, DM)).astype(np.float32)
    f = gp.spmd(lambda ws, x: pipelined(ws, x, shift), pipe_mesh, in_shardings=(P("pipe", None, None), P(None, "data", None)))
    close(f(ws, x), jax.vmap(lambda xb: sequential(ws, xb))(x))
    plan = f.plan(ws, x)
    assert not report_problems(plan), report_problems(plan)
    assert not [c for c in plan.collectives if c.kind in ("all-gather", "all-to-all") and (c.in_loop or c.op_id < 0)]
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("shift", sorted(SHIFTS))
def test_pipeline_in_a_scan_equals_the_layers_in_sequence(pipe_mesh, shift):
    """Every shift form: equal to the layers in sequence; the weight stack never gathered,
    the state update local (no all-to-all), nothing gathered inside the loop."""
    plan = pipeline_plan(pipe_mesh, shift)
    assert plan.sharding_of("arg0") == gp.Sharding(pipe_mesh, P("pipe", None, None))
    assert {c.kind for c in plan.collectives if c.in_loop} == {"collective-permute"}


def _one_permute_per_iteration(pipe_mesh, shift):
    plan = pipeline_plan(pipe_mesh, shift)
    body = [c for c in plan.collectives if c.in_loop]
    assert [(c.kind, c.axes) for c in body] == [("collective-permute", ("pipe",))], plan.report()
    assert body[0].bytes_per_device == MB // 2 * DM * 4  # one microbatch shard: one stage, half the batch


def test_pipeline_shift_is_one_collective_permute_per_iteration(pipe_mesh):
    _one_permute_per_iteration(pipe_mesh, "pad")


@pytest.mark.slow
@pytest.mark.parametrize("shift", ["roll", "slice+concatenate", "pad+slice"])
def test_pipeline_other_shift_forms_one_collective_permute(pipe_mesh, shift):
    """The other forms fold into one op before propagation (gspmd_py/frontend/shifts.py): a rotate, or
    one pad with negative padding."""
    _one_permute_per_iteration(pipe_mesh, shift)


@pytest.mark.slow
def test_gradients_leave_the_loop_partial_and_are_reduced_once(mesh):
    """A scanned stack's data-parallel weight gradients (ys of the transposed scan) and a
    loop-constant weight's gradient (a carried accumulator) stay partial sums through the
    loop: one all-reduce over x after it, as the unrolled program combines them."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ws = (rng.standard_normal((3, 16, 16)) * 0.3).astype(np.float32)
    w0 = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)

    def loss(ws, w0, x):
        def layer(h, w):
            return jnp.tanh(h @ w + h @ w0), None
        return lax.scan(layer, x, ws)[0].sum()

    g = jax.grad(loss, argnums=(0, 1))
    f = gp.spmd(g, mesh, in_shardings=(None, None, P("x", None)))
    close(f(ws, w0, x), jax.jit(g)(ws, w0, x))
    plan = f.plan(ws, w0, x)
    assert not [c for c in plan.collectives if c.in_loop and "x" in c.axes], plan.report()
    assert [c.kind for c in plan.collectives if "x" in c.axes] == ["all-reduce"], plan.report()
    assert not report_problems(plan), report_problems(plan)
