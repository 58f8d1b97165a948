"""ragged_dot_general (``lax.ragged_dot``: MoE grouped GEMMs) partitioned: the ragged rows, the
contracting dim and the group (expert) dim sharded, uneven too, f32 and bf16, under jax.grad
(whose rhs gradient is the ragged-contracting form), and the general dimension-number forms;
each equal to the unpartitioned op, with the collectives a user expects."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import check, examples, kinds, maybe, meshes, mesh_of, rand, spec_for

RD = lax.RaggedDotDimensionNumbers
F32 = dict(rtol=1e-4, atol=1e-4)
BF16 = dict(rtol=3e-2, atol=1.5e-1)


def group_sizes(seed: int, m: int, g: int, cover: str) -> np.ndarray:
    """g group sizes over m rows: all rows ("all"), fewer (the rest in no group: zeros), or
    more than m ("over": JAX drops the rows past m)."""
    rng = np.random.default_rng(seed)
    total = {"all": m, "fewer": int(rng.integers(0, m + 1)), "over": m + 3}[cover]
    return rng.multinomial(total, np.ones(g) / g).astype(np.int32)


def moe(lhs, rhs, gs):
    return lax.ragged_dot(lhs, rhs, gs)


@examples(12)
@given(mesh=meshes(), m=st.sampled_from([0, 1, 5, 8, 13, 16]), k=st.sampled_from([0, 3, 4, 8]),
       n=st.sampled_from([2, 5]), g=st.sampled_from([1, 3, 4, 5, 8]),
       cover=st.sampled_from(["all", "fewer", "over"]), bf16=st.booleans(), data=st.data())
def test_ragged_dot_any_sharding(mesh, m, k, n, g, cover, bf16, data):
    dtype = jnp.bfloat16 if bf16 else np.float32
    lhs, rhs = rand((m, k), dtype, low=-1, high=1), rand((g, k, n), dtype, seed=1, low=-1, high=1)
    gs = group_sizes(m * 31 + g, m, g, cover)
    specs = (data.draw(maybe(spec_for(mesh, 2)), "lhs"), data.draw(maybe(spec_for(mesh, 3)), "rhs"), None)
    out = data.draw(maybe(spec_for(mesh, 2)), "out")
    f = gp.spmd(moe, mesh, in_shardings=specs, out_shardings=out)
    got, want = f(lhs, rhs, gs), moe(lhs, rhs, gs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **(BF16 if bf16 else F32))


def moe_grads(lhs, rhs, gs):
    return jax.grad(lambda a, b: jnp.sum(jnp.tanh(lax.ragged_dot(a, b, gs))), argnums=(0, 1))(lhs, rhs)


@examples(8)
@given(mesh=meshes(), m=st.sampled_from([5, 8, 13]), g=st.sampled_from([3, 4, 5]),
       cover=st.sampled_from(["all", "fewer"]), data=st.data())
def test_ragged_dot_grad(mesh, m, g, cover, data):
    """jax.grad: the lhs gradient is a ragged dot again, the rhs gradient the ragged-contracting
    form ([m,k] x [m,n] -> [g,k,n]), its group dim sharded where the experts are."""
    lhs, rhs = rand((m, 4)), rand((g, 4, 6), seed=2)
    gs = group_sizes(m + 7 * g, m, g, cover)
    specs = (data.draw(maybe(spec_for(mesh, 2)), "lhs"), data.draw(maybe(spec_for(mesh, 3)), "rhs"), None)
    check(moe_grads, mesh, (lhs, rhs, gs), in_specs=specs, **F32)


@pytest.mark.parametrize("mesh_i", [0, 1])
@pytest.mark.parametrize("where", ["rows", "experts", "contracting", "rows+experts"])
def test_ragged_dot_collectives(mesh_i, where):
    """m sharded: no collective; k sharded: one all-reduce (or a reduce-scatter into the output's
    sharding); the experts sharded: their rows' sum, one all-reduce."""
    mesh = mesh_of(mesh_i)
    a, b = mesh.axis_names[0], mesh.axis_names[-1]
    lhs, rhs = rand((16, 8)), rand((4, 8, 6), seed=3)
    gs = np.array([5, 0, 7, 3], np.int32)
    specs, out, want = {
        "rows": ((gp.P(a, None), None, None), gp.P(a, None), set()),
        "experts": ((None, gp.P(a, None, None), None), None, {"all-reduce"}),
        "contracting": ((gp.P(None, a), gp.P(None, a, None), None), None, {"all-reduce", "reduce-scatter"}),
        "rows+experts": ((gp.P(a, None), gp.P(b, None, None), None), gp.P(a, None),
                         {"all-reduce", "reduce-scatter"}),
    }[where]
    if where == "rows+experts" and a == b:
        specs, out = (gp.P(a, None), None, None), gp.P(a, None)
        want = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)  # no replicated fallback
        plan = check(moe, mesh, (lhs, rhs, gs), in_specs=specs, out_specs=out, **F32)
    got = kinds(plan)
    assert set(got) <= want and (bool(got) == bool(want)), (where, got, plan.report())


def test_ragged_dot_experts_sharded_special_values():
    """Each device zeroes the rows of other devices' experts before it multiplies: an inf in one
    expert's rows reaches that expert's rows only, as in the unpartitioned op."""
    mesh = mesh_of(0)
    lhs = rand((16, 4))
    lhs[2, 1], lhs[11, 3] = np.inf, np.nan
    rhs = rand((8, 4, 3), seed=4)
    gs = np.array([3, 2, 0, 4, 1, 2, 2, 1], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        check(moe, mesh, (lhs, rhs, gs), in_specs=(None, gp.P("x", None, None), None))


def test_ragged_dot_rows_and_experts_grad_collectives():
    """Data parallel rows and expert parallel weights: the expert weights' gradient is a
    ragged-contracting dot computing only this device's experts, summed over the rows' axis."""
    mesh = mesh_of(1)
    lhs, rhs = rand((16, 8)), rand((4, 8, 6), seed=5)
    gs = np.array([5, 0, 7, 3], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        plan = check(moe_grads, mesh, (lhs, rhs, gs), in_specs=(gp.P("x", None), gp.P("y", None, None), None),
                     out_specs=(gp.P("x", None), gp.P("y", None, None)), **F32)
    assert "all-gather" not in kinds(plan), plan.report()


# -- the general dimension-number forms --------------------------------------------------------------

B, M, K, N, G = 3, 13, 6, 5, 4
GS1 = np.array([3, 0, 5, 4], np.int32)
GS2 = np.array([[3, 0, 5, 4], [1, 2, 3, 4], [0, 0, 13, 0]], np.int32)  # per batch row
NONCONTRACTING = RD(dot_dimension_numbers=(((2,), (2,)), ((0,), (1,))), lhs_ragged_dimensions=(1,),
                    rhs_group_dimensions=(0,))  # [b,m,k] x [g,b,k,n] -> [b,m,n]
CONTRACTING = RD(dot_dimension_numbers=(((1,), (1,)), ((0,), (0,))), lhs_ragged_dimensions=(1,),
                 rhs_group_dimensions=())  # [b,m,k] x [b,m,n] -> [g,b,k,n]
RAGGED_BATCH = RD(dot_dimension_numbers=(((2,), (1,)), ((0,), (0,))), lhs_ragged_dimensions=(0,),
                  rhs_group_dimensions=())  # [b,m,k] x [b,k,n] -> [b,m,n]
FORMS = {
    "noncontracting": (NONCONTRACTING, (B, M, K), (G, B, K, N)),
    "contracting": (CONTRACTING, (B, M, K), (B, M, N)),
    "batch": (RAGGED_BATCH, (B, M, K), (B, K, N)),
}


@examples(10)
@given(mesh=meshes(), form=st.sampled_from(sorted(FORMS)), batched_sizes=st.booleans(), data=st.data())
def test_ragged_dot_general_forms(mesh, form, batched_sizes, data):
    dn, ls, rs = FORMS[form]
    gs = np.array([1, 0, 2], np.int32) if form == "batch" else (GS2 if batched_sizes else GS1)
    lhs, rhs = rand(ls), rand(rs, seed=6)
    specs = (data.draw(maybe(spec_for(mesh, 3)), "lhs"), data.draw(maybe(spec_for(mesh, len(rs))), "rhs"), None)
    out = data.draw(maybe(spec_for(mesh, 4 if form == "contracting" else 3)), "out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gp.PartitionWarning)
        check(lambda a, b, g: lax.ragged_dot_general(a, b, g, dn), mesh, (lhs, rhs, gs), in_specs=specs,
              out_specs=out, **F32)


def test_ragged_dot_kept_whole_is_reported():
    """Group sizes with batch dims keep the ragged rows whole: sharded rows are gathered, and
    the fallback is said (a PartitionWarning naming the op), the result still exact."""
    mesh = mesh_of(1)
    lhs, rhs = rand((B, M, K)), rand((G, B, K, N), seed=7)
    f = lambda a, b, g: lax.ragged_dot_general(a, b, g, NONCONTRACTING)
    with pytest.warns(gp.PartitionWarning, match="ragged_dot_general"):
        check(f, mesh, (lhs, rhs, GS2), in_specs=(gp.P(None, "y", None), None, None), **F32)


def test_ragged_dot_rule_text():
    """The rule in the factor notation: rows pass, k a sum, the experts a sum, the sizes whole."""
    from gspmd_py.frontend.trace import trace
    from gspmd_py.ops import rule_for

    g = trace(moe, [jax.ShapeDtypeStruct((16, 8), np.float32), jax.ShapeDtypeStruct((4, 8, 6), np.float32),
                    jax.ShapeDtypeStruct((4,), np.int32)])
    op = next(o for o in g.ops if o.prim == "ragged_dot_general")
    assert str(rule_for(op)) == ("[j,i], [k,i,l], [m] -> [j,l]   (i: reduction(sum), k: reduction(sum), "
                                 "m: need_replication)")


def test_ragged_dot_flops_count_each_row_once():
    """The cost model counts a ragged dot as a dot without the group dim (each row meets one
    group): rows sharded 8 ways, 2 * (64/8) * 32 * 16 per device, plus the group-size arithmetic."""
    S = jax.ShapeDtypeStruct
    plan = gp.spmd(moe, mesh_of(0), in_shardings=(gp.P("x", None), None, None)).plan(
        S((64, 32), np.float32), S((4, 32, 16), np.float32), S((4,), np.int32))
    flops = plan.cost(gp.Hardware.preset("h100-node")).flops
    assert 2 * 8 * 32 * 16 <= flops < 2 * 2 * 8 * 32 * 16


@pytest.mark.parametrize("lhs_spec,rhs_spec", [(gp.P("x", None), gp.P("x", None, None)),
                                               (gp.P("x", None), gp.P(None, "x", None))])
def test_ragged_dot_reshard_is_no_fallback(lhs_spec, rhs_spec):
    """Rows and experts (or k) both asking for one axis: one is resharded, as for any dot; that is
    no replicated fallback (no PartitionWarning), whichever wins."""
    lhs, rhs = rand((16, 8)), rand((4, 8, 6), seed=8)
    gs = np.array([5, 0, 7, 3], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        check(moe, mesh_of(0), (lhs, rhs, gs), in_specs=(lhs_spec, rhs_spec, None), **F32)
