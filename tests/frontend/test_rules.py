"""gp.rules: specs by pytree key path (issue 10.4), and Flax's logical-axis metadata as in_shardings."""
import re
import warnings

import jax
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import f32
from gspmd_py.frontend.rules import slash_path

P = gp.P
S = jax.ShapeDtypeStruct


def params_tree():
    return {"params": {
        "embed": {"embedding": f32(64, 16)},
        "block_0": {"attn": {"query": {"kernel": f32(16, 32)}, "out": {"kernel": f32(32, 16)}},
                    "mlp": {"up": {"kernel": f32(16, 64), "bias": f32(64)}, "down": {"kernel": f32(64, 16)}}},
    }}


def shardings_by_path(plan, argnum=0):
    out = {}
    for p, s in jax.tree_util.tree_flatten_with_path(plan.in_shardings[argnum])[0]:
        out[slash_path(p)] = s.shardy()
    return out


def test_rules_first_match_wins_and_unmatched_leaves_are_open(mesh):
    r = gp.rules([
        ("*attn/query/kernel", P(None, "y")),
        ("*attn/out/kernel", P("y", None)),
        (re.compile(r"mlp/up/(kernel|bias)$"), P("y")),   # regex: searched in the path
        ("*mlp/up/kernel", P(None, "y")),                   # also matches, but the regex above comes first
        ("*/mlp/down", P("y", None)),                       # a glob matching a subtree (prefix of the path)
    ])
    f = gp.spmd(lambda t: jax.tree.map(lambda v: v * 2, t), mesh, in_shardings=(r,))
    p = f.plan(params_tree())
    got = shardings_by_path(p)
    assert got["params/block_0/attn/query/kernel"] == "[{}, {y}]"
    assert got["params/block_0/attn/out/kernel"] == "[{y}, {}]"
    assert got["params/block_0/mlp/up/kernel"] == "[{y}, {}]"
    assert got["params/block_0/mlp/up/bias"] == "[{y}]"
    assert got["params/block_0/mlp/down/kernel"] == "[{y}, {}]"
    # unmatched: open, propagation decides (here nothing constrains the embedding: replicated)
    assert got["params/embed/embedding"] == "[{}, {}]"


def test_rules_inside_a_tuple_of_per_argument_specs_and_on_outputs(mesh):
    r = gp.rules([("*kernel", P(None, "y")), ("*bias", P("y"))])

    def fn(params, x):
        h = x @ params["w"]["kernel"] + params["w"]["bias"]
        return {"h": h, "s": h.sum()}
    args = ({"w": {"kernel": np.ones((8, 16), np.float32), "bias": np.ones(16, np.float32)}},
            np.ones((4, 8), np.float32))
    f = gp.spmd(fn, mesh, in_shardings=(r, P("x", None)),
                out_shardings=gp.rules([("h", P("x", "y")), ("s", None)]))
    p = f.plan(*args)
    assert p.sharding_of("arg0['w']['kernel']").shardy() == "[{}, {y}]"
    assert p.out_shardings["h"].shardy() == "[{x}, {y}]"
    out = f(*args)
    np.testing.assert_allclose(np.asarray(out["s"]), fn(*args)["s"])


def test_rules_at_the_top_level_see_the_argument_index(mesh):
    r = gp.rules([("0/*kernel", P(None, "y")), ("1", P("x", None))])
    p = gp.spmd(lambda t, x: x @ t["kernel"], mesh, in_shardings=r).plan({"kernel": f32(8, 16)}, f32(4, 8))
    assert p.sharding_of("arg0['kernel']").shardy() == "[{}, {y}]" and p.sharding_of("arg1").shardy() == "[{x}, {}]"


def test_rules_errors(mesh):
    tree = params_tree()
    ident = lambda t: t
    # a pattern that matches nothing: an error naming it and showing the paths there
    r = gp.rules([("*attn/query/kernel", P(None, "y")), ("*atn/key/kernel", P(None, "y"))])
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\]: gp.rules rule 1 \('\*atn/key/kernel' -> .*\) "
                                           r"matched no leaf; the key paths there are 'params/block_0/attn/out/kernel', "):
        gp.spmd(ident, mesh, in_shardings=(r,)).plan(tree)
    # ... or a warning, by flag
    r = gp.rules([("*attn/query/kernel", P(None, "y")), ("*atn*", P("y"))], unmatched="warn")
    with pytest.warns(UserWarning, match=r"rule 1 \('\*atn\*'"):
        gp.spmd(ident, mesh, in_shardings=(r,)).plan(tree)
    # a rule whose spec does not fit a leaf it matches: the leaf by key path and the rule
    r = gp.rules([("*mlp*", P(None, "y"))])
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\] rule 0 \('\*mlp\*' -> P\(None, 'y'\)\) for "
                                           r"arg0\['params'\]\['block_0'\]\['mlp'\]\['up'\]\['bias'\] f32\[64\]: "
                                           r".*2 entries.*rank 1"):
        gp.spmd(ident, mesh, in_shardings=(r,)).plan(tree)
    # an unknown axis: named, with a hint for logical names
    r = gp.rules([("*kernel", P("embed", "mlp"))])
    with pytest.raises(gp.SpecError, match=r"unknown mesh axis 'embed'.*logical"):
        gp.spmd(ident, mesh, in_shardings=(r,)).plan(tree)
    # bad rules: at construction
    with pytest.raises(gp.SpecError, match="rule 0 must be a \\(pattern, spec\\) pair"):
        gp.rules(["*kernel"])
    with pytest.raises(gp.SpecError, match="rule 0 pattern must be a glob string or a compiled regex"):
        gp.rules([(3, P("x"))])
    with pytest.raises(gp.SpecError, match=r"rule 0 \('\*'\) maps to 'x', not a spec"):
        gp.rules([("*", "x")])
    with pytest.raises(gp.SpecError, match="unmatched must be one of"):
        gp.rules([("*", None)], unmatched="sometimes")


def test_same_rules_object_checked_over_all_its_uses(mesh):
    """One rules object used for two arguments: a pattern matching in either one is fine."""
    r = gp.rules([("*kernel", P(None, "y")), ("*scale", None)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = gp.spmd(lambda a, b: (a, b), mesh, in_shardings=(r, r)).plan({"kernel": f32(4, 8)}, {"scale": f32(8)})
    assert p.sharding_of("arg0['kernel']").shardy() == "[{}, {y}]"


@pytest.mark.slow
def test_flax_linen_params_by_rules_and_by_logical_metadata(mesh):
    nn = pytest.importorskip("flax.linen")

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(32, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)), name="up")(x)
            return nn.Dense(16, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                           ("mlp", "embed")), name="down")(nn.relu(h))

    model = MLP()
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    boxed = model.init(jax.random.PRNGKey(0), x)
    params = nn.unbox(boxed)
    want = model.apply(params, x)

    # 1. by name
    r = gp.rules([("params/up/kernel", P(None, "y")), ("params/up/bias", P("y")), ("params/down/kernel", P("y", None))])
    f = gp.spmd(model.apply, mesh, in_shardings=(r, P("x", None)))
    p = f.plan(params, x)
    assert shardings_by_path(p)["params/up/kernel"] == "[{}, {y}]"
    assert [c.kind for c in p.collectives] == ["all-reduce"]  # Megatron MLP: one all-reduce
    np.testing.assert_allclose(np.asarray(f(params, x)), want, rtol=1e-5, atol=1e-5)

    # 2. by Flax's logical metadata, mapped to mesh axes with the logical-axis rules
    logical = nn.get_partition_spec(boxed)
    specs = nn.logical_to_mesh(logical, [("batch", "x"), ("embed", None), ("mlp", "y")])
    f2 = gp.spmd(model.apply, mesh, in_shardings=(specs, P("x", None)))
    p2 = f2.plan(params, x)
    assert shardings_by_path(p2) == shardings_by_path(p) | {"params/down/bias": "[{}]"}
    np.testing.assert_allclose(np.asarray(f2(params, x)), want, rtol=1e-5, atol=1e-5)
    # ... and for the boxed tree itself (nn.Partitioned nodes: the spec covers the .value below)
    p3 = gp.spmd(lambda v, x: model.apply(nn.unbox(v), x), mesh, in_shardings=(specs, P("x", None))).plan(boxed, x)
    assert p3.sharding_of("arg0['params']['up']['kernel'].value").shardy() == "[{}, {y}]"
    # logical names passed unmapped: a clear error with the hint
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\]\['params'\]\['down'\]\['kernel'\].*'mlp'.*"
                                           r"logical_to_mesh"):
        gp.spmd(model.apply, mesh, in_shardings=(logical, None)).plan(params, x)


@pytest.mark.slow
def test_nnx_logical_metadata(mesh):
    nnx = pytest.importorskip("flax.nnx")
    nn = pytest.importorskip("flax.linen")

    class Model(nnx.Module):
        def __init__(self, rngs):
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(16, 32, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
            self.down = nnx.Linear(32, 16, kernel_init=nnx.with_partitioning(init, ("mlp", "embed")), rngs=rngs)

        def __call__(self, x):
            return self.down(jax.nn.relu(self.up(x)))

    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(Model(nnx.Rngs(0)))
    specs = nn.logical_to_mesh(nnx.get_partition_spec(state), [("embed", None), ("mlp", "y")])

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    f = gp.spmd(apply, mesh, in_shardings=(specs, P("x", None)))
    p = f.plan(state, x)
    assert p.sharding_of("arg0['up']['kernel'].value").shardy() == "[{}, {y}]"
    assert p.sharding_of("arg0['down']['kernel'].value").shardy() == "[{y}, {}]"
    np.testing.assert_allclose(np.asarray(f(state, x)), apply(state, x), rtol=1e-5, atol=1e-5)
