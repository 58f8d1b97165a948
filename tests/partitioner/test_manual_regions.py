"""A jax.shard_map (manual SPMD region) inside a gp.spmd function (docs/guides/shard_map.md).

The region's operands are resharded to its in_specs, its body runs per device as written
(collectives over the user's axis names, mapped onto the plan's sub-axes when it splits one),
its results carry its out_specs. Every result is compared with ``jax.jit`` of the same
function, whose shard_map runs over ``jax.sharding.Mesh`` of the same devices.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp
from gspmd_py.core import jax_compat as compat
from partition_util import MESH_SHAPES, assert_same, examples, kinds, mesh_of, rand, spec_for

DTYPES = ("float32", "bfloat16", "int32")


@functools.lru_cache(maxsize=None)
def jmesh(shape, names):
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(shape), names)


def jmesh_of(mesh: gp.Mesh):
    return jmesh(tuple(mesh.shape), tuple(mesh.axis_names))


def values(shape, dtype, seed=0):
    x = rand(shape, np.float32, seed)
    return (x * 8).round().astype(dtype) if dtype == "int32" else jnp.asarray(x, dtype)


def tol(dtype):
    return {"bfloat16": 3e-2}.get(dtype, 1e-5)


def compare(fn, mesh, args, in_specs=None, out_specs=None, dtype="float32"):
    """gp.spmd(fn) gives what jax.jit(fn) gives; returns the plan."""
    f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=out_specs)
    want = jax.jit(fn)(*args)
    got = f(*args)
    t = tol(dtype)
    assert_same(got, want, rtol=t, atol=t)
    return f.plan(*args)


# -- psum, surrounding ops sharded otherwise, uneven outer shapes ---------------------------------

@examples(10)
@given(mi=st.integers(0, len(MESH_SHAPES) - 1), rows=st.integers(1, 2), cols=st.sampled_from([0, 1, 3, 4, 8]),
       extra=st.integers(0, 3), dtype=st.sampled_from(DTYPES), data=st.data())
def test_psum_region_between_differently_sharded_ops(mi, rows, cols, extra, dtype, data):
    mesh = mesh_of(mi)
    a = mesh.axis_names[0]
    n = mesh.shape[0] * rows
    region = jax.shard_map(lambda v: lax.psum(v, a), mesh=jmesh_of(mesh), in_specs=JP(a, None),
                           out_specs=JP(None, None))

    def fn(x):
        y = x[:n] * 2 + 1  # the region's input divides; x itself may not
        return jnp.concatenate([region(y), x[n:]], axis=0) - 3

    x = values((n + extra, cols), dtype)
    spec = data.draw(spec_for(mesh, 2, sub_axes=True))
    out = data.draw(spec_for(mesh, 2))
    plan = compare(fn, mesh, (x,), (spec,), out, dtype)
    assert ("all-reduce" in kinds(plan)) == (cols > 0)  # an empty region computes nothing


def test_region_collectives_are_in_the_plan_and_the_cost():
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def body(v, w):
        return lax.psum(v @ w, "x") * (lax.axis_index("y") + 1).astype(v.dtype)

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=(JP("x", None), JP()), out_specs=JP(None, "y"))
    fn = lambda x, w: jnp.sin(region(jnp.cos(x), w)).sum(0)  # noqa: E731
    plan = compare(fn, mesh, (rand((8, 4)), rand((4, 64), seed=1)), (gp.P(None, "y"), None))
    [c] = [c for c in plan.collectives if c.op.startswith("shard_map")]
    assert (c.kind, c.axes, c.bytes_per_device) == ("all-reduce", ("x",), 4 * 64 * 4)
    cost = plan.cost(gp.Hardware.preset("h100-node"))
    assert cost.comm_bytes >= c.bytes_per_device
    assert cost.flops >= 2 * 4 * 4 * 64  # the body's local dot, as the program runs it
    assert "shard_map" in plan.report()


def test_axis_split_by_the_plan_maps_onto_its_sub_axes():
    """x:(1)2 shards an outer value: the plan splits "x" into fine sub-axes, and the region's
    collectives over "x" run over both, major first."""
    mesh = gp.Mesh((4, 2), ("x", "y"))

    def body(v):
        i = lax.axis_index("x")
        s = lax.psum(v * (i + 1).astype(v.dtype), "x")
        r = lax.ppermute(v, "x", [(j, (j + 1) % 4) for j in range(4)])
        return s, r + i.astype(v.dtype)

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=JP("x", None), out_specs=(JP(), JP("x")))

    def fn(x):
        s, r = region(x * 2)
        return s.sum() + r, r.reshape(2, 4, 3)

    plan = compare(fn, mesh, (rand((8, 3)),), (gp.P("x:(1)2", None),), (None, gp.P("x:(2)2", None, None)))
    assert any(":" in a for c in plan.collectives for a in c.axes), plan.collectives


# -- all_gather / all_to_all: MoE-style dispatch --------------------------------------------------

def moe(mesh, experts_axis="x"):
    k = mesh.shape[mesh.axis_names.index(experts_axis)]

    def body(tokens, w, gate):
        t, d = tokens.shape
        g = lax.all_gather(gate, experts_axis, tiled=True)  # every expert's gate, [E]
        send = tokens.reshape(k, t // k, d)  # chunk j goes to the device holding expert j
        got = lax.all_to_all(send, experts_axis, 0, 0, tiled=True)
        mine = g[lax.axis_index(experts_axis)]
        y = jnp.einsum("scd,dh->sch", got, w[0]) * mine
        back = lax.all_to_all(y, experts_axis, 0, 0, tiled=True)
        return back.reshape(t, -1)

    return jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=(JP(experts_axis, None), JP(experts_axis), JP(experts_axis)),
                         out_specs=JP(experts_axis, None))


@examples(8)
@given(mi=st.integers(0, len(MESH_SHAPES) - 1), per=st.integers(1, 2), d=st.sampled_from([2, 3]),
       dtype=st.sampled_from(("float32", "bfloat16")), data=st.data())
def test_moe_dispatch_all_to_all(mi, per, d, dtype, data):
    mesh = mesh_of(mi)
    k = mesh.shape[0]
    region = moe(mesh)
    tokens = values((k * k * per, d), dtype, 1)
    w = values((k, d, 5), dtype, 2)
    gate = values((k,), dtype, 3)

    def fn(tokens, w, gate):
        return jax.nn.relu(region(tokens * 2, w, gate)) @ jnp.ones((5, 3), tokens.dtype)

    specs = tuple(data.draw(spec_for(mesh, r)) for r in (2, 3, 1))
    plan = compare(fn, mesh, (tokens, w, gate), specs, None, dtype)
    assert {"all-to-all", "all-gather"} <= set(kinds(plan))


def test_ragged_all_to_all_region_is_planned_and_priced():
    """MoE dispatch by ragged_all_to_all (XLA:CPU cannot run its opcode: planned only): one
    all-to-all over x in plan.collectives, the bytes of the data operand it sends."""
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def body(op, out, io, ss, oo, rs):
        return lax.ragged_all_to_all(op[0], out[0], io[0], ss[0], oo[0], rs[0], axis_name="x")[None]

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=(JP("x"),) * 6, out_specs=JP("x"))
    S = jax.ShapeDtypeStruct
    args = (S((2, 6), jnp.float32), S((2, 6), jnp.float32)) + (S((2, 2), jnp.int32),) * 4
    plan = gp.spmd(lambda *a: region(*a) * 2, mesh).plan(*args)
    [c] = plan.collectives
    assert (c.kind, c.axes, c.bytes_per_device, c.shape) == ("all-to-all", ("x",), 6 * 4, (6,))
    assert "ragged_all_to_all" in plan.spmd_text()


# -- ppermute ring, axis_index ----------------------------------------------------------------------

@examples(8)
@given(mi=st.integers(0, len(MESH_SHAPES) - 1), cols=st.sampled_from([1, 5]), dtype=st.sampled_from(DTYPES),
       data=st.data())
def test_ppermute_ring_and_axis_index(mi, cols, dtype, data):
    mesh = mesh_of(mi)
    a = mesh.axis_names[-1]
    n = mesh.shape[-1]
    both = tuple(mesh.axis_names)

    def body(v):
        nxt = lax.ppermute(v, a, [(i, (i + 1) % n) for i in range(n)])
        return nxt + lax.axis_index(both).astype(v.dtype)

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=JP(both), out_specs=JP(both))
    x = values((8 * 2, cols), dtype, 4)
    spec = data.draw(spec_for(mesh, 2))
    plan = compare(lambda x: region(x + 1) * 3, mesh, (x,), (spec,), None, dtype)
    assert "collective-permute" in kinds(plan)


def test_collectives_over_a_size_one_axis():
    """A mesh axis of size 1 has no axis in the program: its collectives are what they compute
    on one device (unit dims made or dropped, axis_index 0), next to ones over a real axis."""
    mesh = gp.Mesh((1, 8), ("a", "x"))

    def body(v):
        s = lax.psum(v, "a") + lax.pmax(v, "a") + lax.axis_index("a")
        g = lax.all_gather(v, "a", tiled=True) + lax.all_gather(v, "a", axis=1)[:, 0]
        t = lax.all_to_all(v, "a", 0, 0, tiled=True) + lax.all_to_all(v[None], "a", 0, 1)[:, 0]
        r = lax.ppermute(v, "a", [(0, 0)]) + lax.psum_scatter(v[None], "a", scatter_dimension=0)
        return s + g + t + r + lax.psum(v, "x") + lax.axis_index(("a", "x"))

    region = jax.shard_map(body, mesh=jmesh((1, 8), ("a", "x")), in_specs=JP("x"), out_specs=JP("x"),
                           check_vma=False)
    compare(region, mesh, (rand((16,), seed=9),), (gp.P("x"),))


def test_untiled_collectives():
    """all_gather / all_to_all / psum_scatter with tiled=False (a new or dropped mapped dim)."""
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def body(v):  # v [2, 4]
        g = lax.all_gather(v, "y", axis=1)  # [2, 4, 4]
        t = lax.all_to_all(v, "y", 1, 0)  # [4, 2]: the y-th column of every device's v
        s = lax.psum_scatter(g, "y", scatter_dimension=1)  # [2, 4]
        return g.sum(1) + t.T + s

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=JP("x", "y"), out_specs=JP("x", "y"))
    compare(lambda x: region(x * 2), mesh, (rand((4, 16), seed=10),), (gp.P("y", None),))


# -- grad, vmap, scan -------------------------------------------------------------------------------

@pytest.mark.parametrize("mi", range(len(MESH_SHAPES)))
def test_grad_through_region(mi):
    mesh = mesh_of(mi)
    a = mesh.axis_names[0]
    n = mesh.shape[0]

    def body(v, w):
        h = jnp.tanh(v @ w)
        return lax.psum(h, a), lax.ppermute(h, a, [(i, (i + 1) % n) for i in range(n)])

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=(JP(a, None), JP()), out_specs=(JP(), JP(a)))

    def loss(x, w):
        s, r = region(x, w)
        return jnp.sum(s ** 2) + jnp.sum(jnp.sin(r))

    g = jax.grad(loss, argnums=(0, 1))
    compare(g, mesh, (rand((2 * n, 3), seed=5), rand((3, 4), seed=6)), (gp.P(None, a), None))


def test_vmap_of_region():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    region = jax.shard_map(lambda v: lax.psum(v, "y") * 2, mesh=jmesh_of(mesh), in_specs=JP(("x", "y")),
                           out_specs=JP("x"))
    compare(jax.vmap(region), mesh, (rand((3, 16)),), (gp.P(None, "x"),))


def test_region_inside_scan():
    mesh = gp.Mesh((2, 2, 2), ("x", "y", "z"))

    def body(h, w):
        h = jnp.tanh(lax.psum(h @ w, "y"))  # a contraction over y's shards
        return h + lax.ppermute(h, "x", [(0, 1), (1, 0)])

    region = jax.shard_map(body, mesh=jmesh_of(mesh), in_specs=(JP("x", "y"), JP("y")), out_specs=JP("x"))

    def fn(h, ws):
        def step(c, w):
            o = region(c, w)
            return jnp.concatenate([o, o * 0.5], axis=1), None

        out, _ = lax.scan(step, h, ws)
        return out

    plan = compare(fn, mesh, (rand((4, 4), seed=7), rand((3, 4, 2), seed=8) / 2), (gp.P("x"), None))
    assert any(c.in_loop for c in plan.collectives if c.op.startswith("shard_map"))


def test_shard_map_params_read_on_this_jax():
    region = jax.shard_map(lambda a, b: (a, b), mesh=jmesh((2, 4), ("x", "y")), in_specs=(JP("x"), JP(None, "y")),
                           out_specs=(JP("x"), JP(None, "y")))
    [eqn] = jax.make_jaxpr(region)(jnp.ones(8), jnp.ones((2, 8))).jaxpr.eqns
    assert eqn.primitive.name == "shard_map"
    ins, outs = compat.shard_map_specs(eqn.params)
    assert (tuple(ins), tuple(outs)) == ((JP("x"), JP(None, "y")),) * 2
    assert compat.shard_map_manual(eqn.params, ("x", "y")) == ("x", "y")


# -- errors -----------------------------------------------------------------------------------------

def test_mesh_mismatch_names_the_region_and_the_axis():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    other = jax.shard_map(lambda v: v, mesh=jmesh((4, 2), ("x", "y")), in_specs=JP("x"), out_specs=JP("x"))
    with pytest.raises(gp.ShardingError, match=r"shard_map region at .*test_manual_regions.*axis 'x' is size 4"):
        gp.spmd(lambda v: other(v) + 1, mesh).plan(jax.ShapeDtypeStruct((8,), jnp.float32))
    renamed = jax.shard_map(lambda v: v, mesh=jmesh((2, 4), ("x", "w")), in_specs=JP("x"), out_specs=JP("x"))
    with pytest.raises(gp.ShardingError, match=r"shard_map region .*axis 'w'"):
        gp.spmd(lambda v: renamed(v) + 1, mesh).plan(jax.ShapeDtypeStruct((8,), jnp.float32))


def test_partial_auto_region_is_refused_naming_the_axes():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    region = jax.shard_map(lambda v: lax.psum(v, "x"), mesh=jmesh_of(mesh), in_specs=JP("x"), out_specs=JP(),
                           axis_names={"x"})
    with pytest.raises(gp.UnsupportedOpError, match=r"manual over \('x',\) only, leaving mesh axes \('y',\)"):
        gp.spmd(lambda v: region(v) * 2, mesh).plan(jax.ShapeDtypeStruct((8,), jnp.float32))
