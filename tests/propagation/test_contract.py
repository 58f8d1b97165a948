"""One contract between propagation and the partitioner.

For every sharding rule (ops/), sample programs are planned with random input shardings on
the four test meshes; for every op, the operand shardings its partitioner handler received
must equal the sharding projection propagation recorded (an operand held whole on a
windowed dim may stay whole: the handler slices its window locally). A rule with no sample
here fails the coverage test, so a new rule cannot skip the contract.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from gspmd_py.ops.registry import rule_functions
from partition_util import assert_same, examples, mesh_of, rand, spec_for

IDX = np.array([3, 0, 5, 5, 1], np.int32)


def conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def loop(a, b):
    def step(c, row):
        return c * 0.5 + row, c.sum()
    c, ys = lax.scan(step, b[0], a)
    return c, ys


def while_loop(a):
    return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, jnp.tanh(c[1]) * 2), (0, a))[1]


def manual(a):
    """A jax.shard_map region over whatever mesh the program is traced under (gp.spmd's), rows
    over every axis, a psum inside; outside any mesh the same sum computed plainly."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return a.sum(0) * 2 + 1
    axes = mesh.axis_names
    P = jax.sharding.PartitionSpec
    return jax.shard_map(lambda b: lax.psum(b.sum(0), axes) * 2 + 1, in_specs=P(axes), out_specs=P())(a)


def branch(a, b):
    return lax.cond(a.sum() > 0, lambda u, v: u * 2 + v, lambda u, v: u - v, a, b)


# rule function name -> [(fn, input shapes)]
SAMPLES = {
    "elementwise": [(lambda a, b: jnp.tanh(a) * b + 1.0, [(6, 7), (6, 7)]),
                    (lambda a, b: jnp.where(a > b, a, -b), [(5, 8), (1, 8)])],
    "dot_general": [(lambda a, b: a @ b, [(6, 8), (8, 5)]),
                    (lambda a, b: jnp.einsum("bik,bkj->bij", a, b), [(4, 3, 6), (4, 6, 5)])],
    "conv": [(conv, [(2, 9, 7, 3), (3, 3, 3, 4)]),
             (jax.grad(lambda x, w: conv(x, w).sum(), argnums=1), [(2, 9, 7, 3), (3, 3, 3, 4)])],
    "reduce_window": [(maxpool, [(2, 9, 8, 3)])],
    "select_and_scatter_add": [(jax.grad(lambda x: maxpool(x).sum()), [(2, 9, 8, 3)])],
    "gather": [(lambda t: t[IDX], [(7, 6)])],
    "scatter": [(lambda t, v: t.at[IDX].add(v), [(7, 6), (5, 6)])],
    "reduce": [(lambda a: (jnp.sum(a, axis=1), jnp.max(a, axis=0)), [(6, 9)])],
    "argreduce": [(lambda a: jnp.argmax(a, axis=1), [(6, 9)])],
    "scan_along": [(lambda a: jnp.cumsum(a, axis=0), [(9, 4)])],
    "sort": [(lambda a: jnp.sort(a, axis=1), [(6, 8)])],
    "top_k": [(lambda a: lax.top_k(a, 2), [(6, 8)])],
    "replicated": [(lambda a: a + jax.random.uniform(jax.random.fold_in(jax.random.key(1), 2), a.shape), [(4, 8)])],
    "generic_reduce": [(lambda a: jax.lax.reduce(a, 0.0, lambda u, v: u * 0.5 + v, (1,)), [(4, 8)])],
    "batched": [(lambda a: jnp.fft.fft(a).real, [(4, 8)]),
                (lambda a: jnp.linalg.cholesky(a @ jnp.swapaxes(a, -1, -2) + 4 * jnp.eye(4)), [(6, 4, 4)]),
                (lambda a, b: jnp.linalg.solve(a @ jnp.swapaxes(a, -1, -2) + 4 * jnp.eye(4), b), [(5, 4, 4), (5, 4, 3)])],
    "key_op": [(lambda a: jax.random.key_data(jax.vmap(lambda k: jax.random.split(jax.random.fold_in(k, 3), 2))(
        jax.random.wrap_key_data((jnp.abs(a[:, :2]) * 1000).astype(jnp.uint32)))).astype(jnp.float32), [(6, 5)])],
    "manual": [(manual, [(8, 5)])],
    "control": [(loop, [(5, 6), (5, 6)]), (while_loop, [(6, 4)]), (branch, [(4, 6), (4, 6)])],
    "transpose": [(lambda a: a.T * 2, [(6, 5)])],
    "broadcast_in_dim": [(lambda a: jnp.broadcast_to(a[:, None, :], (6, 4, 5)), [(6, 5)])],
    "reshape": [(lambda a: a.reshape(3, 4, 6), [(12, 6)]), (lambda a: a.reshape(-1), [(6, 4)])],
    "iota": [(lambda a: a + jnp.arange(a.shape[0], dtype=a.dtype)[:, None], [(7, 4)])],
    "pad": [(lambda a: jnp.pad(a, ((1, 2), (0, 1))), [(7, 5)])],
    "slice_": [(lambda a: a[1:7:2], [(9, 4)])],
    "rev": [(lambda a: a[::-1], [(7, 4)])],
    "concatenate": [(lambda a, b: jnp.concatenate([a, b]), [(5, 4), (3, 4)])],
    "dynamic_slice": [(lambda a: lax.dynamic_slice_in_dim(a, 1, 2, 0), [(9, 4)]),
                      (lambda a: lax.dynamic_slice_in_dim(a, 1, 6, 0), [(9, 4)])],
    "dynamic_update_slice": [(lambda a, b: lax.dynamic_update_slice_in_dim(a, b, 2, 0), [(9, 4), (3, 4)])],
    "split": [(lambda a: jnp.split(a, [2], axis=0), [(7, 3)])],
    "rotate": [(lambda a: jnp.roll(a, 3, axis=0), [(8, 3)]), (lambda a: jnp.roll(a, -1, axis=1), [(5, 7)])],
    "random_bits": [(lambda a: a + jax.random.uniform(jax.random.key(1), a.shape), [(7, 5)])],
    "key_split": [(lambda a: a + jax.random.key_data(jax.random.split(jax.random.key(1), a.shape))[..., 0].astype(
        jnp.float32), [(7, 5)]),
                  (lambda a: a + jax.random.key_data(jax.vmap(lambda k: jax.random.split(k, 5))(
                      jax.random.split(jax.random.key(2), 6)))[..., 1].astype(jnp.float32), [(6, 5)])],
    "stack": [(lambda a, b: jnp.stack([a, b], axis=1), [(7, 3), (7, 3)])],
    "unstack": [(lambda a: lax.unstack(a, axis=1), [(5, 3)])],
    "tile": [(lambda a: jnp.tile(a, (2, 3)), [(5, 4)])],
    "no_operands": [(lambda a: jnp.diag(a), [(5, 5)])],  # platform_index picks jnp.diag's branch
    "select_and_gather_add": [(lambda a, t: jax.jvp(lambda v: lax.reduce_window(
        v, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (a,), (t,))[1], [(2, 9, 8, 3), (2, 9, 8, 3)])],
    "debug_callback": [(lambda a: (jax.debug.callback(lambda v: None, a), a * 2)[1], [(6, 5)])],
    "dce_sink": [(lambda a: (lax.dce_sink(jnp.sin(a)), a * 2)[1], [(6, 5)])],
    "ragged_dot_general": [(lambda a, w: lax.ragged_dot(a, w, jnp.array([2, 0, 4], jnp.int32)), [(7, 5), (3, 5, 4)]),
                           (jax.grad(lambda a, w: jnp.sum(lax.ragged_dot(a, w, jnp.array([2, 0, 4], jnp.int32)) ** 2),
                                     argnums=(0, 1)), [(7, 5), (3, 5, 4)])],
    "pure_callback": [(lambda a: jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(a.shape, a.dtype),
                                                   a), [(6, 5)])],
}
CASES = [(name, i) for name, fns in sorted(SAMPLES.items()) for i in range(len(fns))]


def test_every_rule_has_a_sample():
    rules = {fn.__name__ for fn in rule_functions()}
    assert rules <= set(SAMPLES), f"rules without a contract sample: {sorted(rules - set(SAMPLES))}"


def projection_violations(plan) -> list[str]:
    bad = []
    for op in plan.graph.walk():
        seen = plan.diagnostics.seen_operands.get(op.id)
        assert seen is not None, f"{op.prim} #{op.id} was not partitioned"
        rule, want = plan.prop.rules[op.id], plan.op_plans[op.id].operands
        for i, (got, proj) in enumerate(zip(seen, want)):
            for d, (g, w) in enumerate(zip(got, proj)):
                if g != w and not (not g and rule.windowed(i, d)):
                    bad.append(f"{op.prim} #{op.id} operand {i} dim {d}: handler got {g}, projection says {w}")
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("name,i", CASES)
@examples(4)
@given(data=st.data())
def test_handlers_execute_the_recorded_projection(name, i, data):
    fn, shapes = SAMPLES[name][i]
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    specs = tuple(data.draw(spec_for(mesh, len(s))) for s in shapes)
    args = [rand(s, seed=k) for k, s in enumerate(shapes)]
    f = gp.spmd(fn, mesh, in_shardings=specs)
    plan = f.plan(*args)
    assert not projection_violations(plan), projection_violations(plan)
    assert_same(f(*args), fn(*map(jnp.asarray, args)), rtol=1e-4, atol=1e-4)


# -- registry integrity ------------------------------------------------------------------------

def test_rules_name_checked_handlers_and_every_handler_exists():
    from gspmd_py.ops.registry import handler_names_in_use, register
    from gspmd_py.ops.rule import HANDLER_NAMES
    from gspmd_py.partitioner import registry

    assert handler_names_in_use() <= HANDLER_NAMES <= set(registry.HANDLERS)
    with pytest.raises(ValueError, match="unknown handler 'dott'"):
        register("my_prim", handler="dott")
    with pytest.raises(ValueError, match="duplicate sharding rule for primitive 'tanh'"):
        register("tanh", handler="elementwise")(lambda op: None)
    with pytest.raises(ValueError, match="duplicate partitioner handler 'dot'"):
        registry.handler("dot")(lambda *a: None)
    with pytest.raises(ValueError, match="not a rule handler name"):
        registry.handler("dott")(lambda *a: None)
    saved = registry.HANDLERS.pop("dot")
    try:
        with pytest.raises(ValueError, match=r"without a partitioner handler: \['dot'\]"):
            registry.check_complete()
    finally:
        registry.HANDLERS["dot"] = saved


# -- collectives are data ----------------------------------------------------------------------

def _block(x, w1, w2):
    def step(h, w):
        return jnp.tanh(h @ w) @ w.T, None
    h, _ = lax.scan(step, x, jnp.concatenate([w1[None], w2[None]]))
    return h.sum(0), jnp.max(h, axis=1)


def test_collectives_are_the_same_across_plans_and_re_traces():
    mesh = mesh_of(1)
    args = [rand((8, 16)), rand((16, 16), seed=1), rand((16, 16), seed=2)]
    specs = (gp.P("x", "y"), gp.P(None, "y"), gp.P(None, "y"))
    p1 = gp.spmd(_block, mesh, in_shardings=specs).plan(*args)
    p2 = gp.spmd(_block, mesh, in_shardings=specs).plan(*args)
    first = [(c, c.op_id, c.shape, c.dtype, c.reduce, c.tensors, c.in_loop) for c in p1.collectives]
    assert first and first == [(c, c.op_id, c.shape, c.dtype, c.reduce, c.tensors, c.in_loop) for c in p2.collectives]
    assert any(c.in_loop for c in p1.collectives)
    p1.lower_text(), p1.lower_text()  # lowering re-traces the program: the records do not change
    assert [(c, c.op_id) for c in p1.collectives] == [f[:2] for f in first]
    assert p1.spmd_text() == p2.spmd_text()


def test_a_max_over_a_sharded_dim_is_a_max_all_reduce():
    mesh = mesh_of(1)
    x = rand((6, 13))
    x[2, 7] = np.nan
    f = gp.spmd(lambda a: jnp.max(a, axis=1), mesh, in_shardings=(gp.P(None, ("x", "y")),))
    plan = f.plan(x)
    assert [(c.kind, c.reduce) for c in plan.collectives] == [("all-reduce", "max")]
    assert_same(f(x), jnp.max(jnp.asarray(x), axis=1))  # NaN survives the all-reduce


def test_combine_threshold_bytes_limits_the_combiner():
    mesh = mesh_of(1)

    def grads(a, b, c):  # three independent data-parallel sums
        return a.sum(0), b.sum(0), c.sum(0)

    args = [rand((8, 16), seed=i) for i in range(3)]
    specs = (gp.P("x", None),) * 3
    plan = gp.spmd(grads, mesh, in_shardings=specs).plan(*args)
    assert [(c.kind, c.tensors) for c in plan.collectives] == [("all-reduce", 3)]
    plan = gp.spmd(grads, mesh, in_shardings=specs, combine_threshold_bytes=0).plan(*args)
    assert [(c.kind, c.tensors) for c in plan.collectives] == [("all-reduce", 1)] * 3
    plan = gp.spmd(grads, mesh, in_shardings=specs, combine_threshold_bytes=128).plan(*args)
    assert [c.tensors for c in plan.collectives] == [2, 1]  # 64 bytes each
    with pytest.raises(gp.ShardingError, match="combine_threshold_bytes"):
        gp.spmd(grads, mesh, combine_threshold_bytes=-1)
