"""in_shardings / out_shardings over any JAX pytree, matched by key (issue 10.3, issue 7's OrderedDict
and NamedSharding-order defects); errors name the leaf by key path, with short reprs."""
import collections
import dataclasses
import typing

import jax
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import f32

P = gp.P
S = jax.ShapeDtypeStruct


def arr(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def shardy(plan, name):
    return plan.sharding_of(name).shardy()


def test_ordered_dict_specs_land_on_their_keys(mesh):
    """Regression (issue 7): specs were matched in sorted-key order, leaves come in insertion order."""
    od = collections.OrderedDict([("b", arr(8, 4)), ("a", arr(4, 8, seed=1))])
    spec = collections.OrderedDict([("b", P("x", None)), ("a", P(None, "y"))])
    fn = lambda d: (d["a"] * 2, d["b"] + 1)
    f = gp.spmd(fn, mesh, in_shardings=(spec,))
    p = f.plan(od)
    assert shardy(p, "arg0['b']") == "[{x}, {}]"
    assert shardy(p, "arg0['a']") == "[{}, {y}]"
    got = f(od)
    np.testing.assert_allclose(np.asarray(got[0]), od["a"] * 2)
    np.testing.assert_allclose(np.asarray(got[1]), od["b"] + 1)
    # a plain dict of specs (any key order) for an OrderedDict argument: matched by key too
    p2 = gp.spmd(fn, mesh, in_shardings=({"a": P(None, "y"), "b": P("x", None)},)).plan(od)
    assert shardy(p2, "arg0['b']") == "[{x}, {}]" and shardy(p2, "arg0['a']") == "[{}, {y}]"


class Pair(typing.NamedTuple):
    w: typing.Any
    b: typing.Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    kernel: typing.Any
    bias: typing.Any
    width: int = dataclasses.field(default=8, metadata=dict(static=True))


def test_named_tuple_and_registered_dataclass(mesh):
    def fn(layer, pair):
        return layer.kernel @ pair.w + layer.bias + pair.b
    specs = (Layer(P(None, "y"), None), Pair(P("y", None), None))
    f = gp.spmd(fn, mesh, in_shardings=specs, out_shardings=P("x", None))
    layer, pair = Layer(arr(8, 16), arr(8)), Pair(arr(16, 8, seed=2), arr(8, seed=3))
    p = f.plan(layer, pair)
    assert shardy(p, "arg0.kernel") == "[{}, {y}]" and shardy(p, "arg1.w") == "[{y}, {}]"
    np.testing.assert_allclose(np.asarray(f(layer, pair)), fn(layer, pair), rtol=1e-5, atol=1e-5)
    # a plain tuple of specs for a NamedTuple argument: by position
    p2 = gp.spmd(fn, mesh, in_shardings=(None, (P("y", None), None))).plan(layer, pair)
    assert shardy(p2, "arg1.w") == "[{y}, {}]"


def test_none_leaves_and_outputs_pytree(mesh):
    def fn(d):
        return {"sum": d["a"] + 1, "none": None, "pair": (d["a"] * 2, d["a"].sum(0))}
    f = gp.spmd(fn, mesh, in_shardings=({"a": P("x", "y"), "skip": None},),
                out_shardings={"sum": P("x", None), "none": None, "pair": (P(None, "y"), None)})
    d = {"a": arr(8, 8), "skip": None}
    p = f.plan(d)
    assert p.out_shardings["sum"].shardy() == "[{x}, {}]" and p.out_shardings["pair"][0].shardy() == "[{}, {y}]"
    out = f(d)
    assert out["none"] is None
    np.testing.assert_allclose(np.asarray(out["pair"][1]), d["a"].sum(0), rtol=1e-5)


def test_single_spec_broadcasts_over_a_pytree(mesh):
    f = gp.spmd(lambda d: jax.tree.map(lambda v: v * 2, d), mesh, in_shardings=P("x"))
    p = f.plan({"a": f32(8, 4), "b": [f32(8), f32(16, 2)]})
    assert {shardy(p, n) for n in ("arg0['a']", "arg0['b'][0]", "arg0['b'][1]")} == {"[{x}, {}]", "[{x}]"}


def test_rank_error_names_the_leaf_by_key_path(mesh):
    specs = ({"params": {"dense": {"kernel": P("x", "y", None), "bias": None}}},)
    f = gp.spmd(lambda t: t["params"]["dense"]["kernel"].sum(), mesh, in_shardings=specs)
    args = {"params": {"dense": {"kernel": f32(4, 8), "bias": f32(8)}}}
    with pytest.raises(gp.SpecError) as e:
        f.plan(args)
    msg = str(e.value)
    assert "in_shardings[0]['params']['dense']['kernel']" in msg and "3 entries" in msg and "rank 2" in msg
    assert "leaf" not in msg and len(msg) < 300


def test_structure_errors_name_the_path(mesh):
    args = {"params": {"dense": {"kernel": f32(4, 8)}}}
    bad_keys = ({"params": {"dense": {"kernal": P("x")}}},)
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\]\['params'\]\['dense'\]: keys \['kernal'\] do not "
                                           r"match .*\['kernel'\]"):
        gp.spmd(lambda t: t, mesh, in_shardings=bad_keys).plan(args)
    deep = ({"params": {"dense": {"kernel": {"w": P("x")}}}},)
    with pytest.raises(gp.SpecError, match=r"\['kernel'\]: a dict of specs, but the value there is f32\[4,8\]"):
        gp.spmd(lambda t: t, mesh, in_shardings=deep).plan(args)
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\]\['params'\]: 'oops' \(str\) is not a spec"):
        gp.spmd(lambda t: t, mesh, in_shardings=({"params": "oops"},)).plan(args)


def test_big_reprs_are_cut(mesh):
    class Big:
        def __repr__(self):
            return "Big(" + "x" * 3000 + ")"
    with pytest.raises(gp.SpecError) as e:
        gp.spmd(lambda a: a, mesh, in_shardings=Big()).plan(f32(4))
    assert len(str(e.value)) < 400
    with pytest.raises(gp.AnnotationError) as e:
        gp.spmd(lambda a, b: a, mesh).plan(f32(4), {"w": Big()})
    assert "arg1['w']" in str(e.value) and len(str(e.value)) < 400


def test_named_sharding_device_order_is_honoured(mesh):
    """Regression (issue 7): a NamedSharding over a jax Mesh with another device order had its order
    ignored. The same devices transposed: its "x" is the gp mesh's minor half of "y"."""
    devs = np.array(jax.devices()[:8])
    jm = jax.sharding.Mesh(devs.reshape(4, 2).T, ("x", "y"))      # x: stride 1, y: stride 2
    ns = jax.sharding.NamedSharding(jm, jax.sharding.PartitionSpec("x", None))
    f = gp.spmd(lambda a: a * 2, mesh, in_shardings=(ns,), out_shardings=ns)
    a = arr(8, 4)
    p = f.plan(a)
    assert shardy(p, "arg0") == "[{y:(2)2}, {}]"
    assert gp.Sharding(mesh, ns) == p.sharding_of("arg0")
    out = f(a)
    np.testing.assert_allclose(np.asarray(out), a * 2)
    # each device holds the rows jax's own layout gives it
    want = jax.device_put(a * 2, ns)
    got_rows = {s.device.id: s.index for s in out.addressable_shards}
    assert got_rows == {s.device.id: s.index for s in want.addressable_shards}


def test_named_sharding_device_order_not_expressible_is_refused(mesh):
    devs = np.array(jax.devices()[:8])
    jm = jax.sharding.Mesh(devs[[0, 1, 2, 3, 5, 4, 6, 7]].reshape(2, 4), ("x", "y"))
    ns = jax.sharding.NamedSharding(jm, jax.sharding.PartitionSpec(None, "y"))
    with pytest.raises(gp.SpecError, match=r"in_shardings\[0\].*orders the devices \[0, 1, 2, 3, 5, 4, 6, 7\].*"
                                           r"cannot be expressed"):
        gp.spmd(lambda a: a, mesh, in_shardings=(ns,)).plan(f32(4, 8))
    # the replicas of a tile may come in any order: P("x") is the same layout as the gp mesh's
    ok = jax.sharding.NamedSharding(jm, jax.sharding.PartitionSpec("x"))
    assert gp.Sharding(mesh, ok) == gp.Sharding(mesh, P("x"))
    other = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    with pytest.raises(gp.SpecError, match="mesh axes"):
        gp.Sharding(mesh, jax.sharding.NamedSharding(other, jax.sharding.PartitionSpec("x")))


@pytest.mark.slow
def test_equinox_module_with_module_shaped_specs(mesh):
    eqx = pytest.importorskip("equinox")

    class MLP(eqx.Module):
        l1: eqx.nn.Linear
        l2: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.l1 = eqx.nn.Linear(8, 32, key=k1)
            self.l2 = eqx.nn.Linear(32, 8, key=k2)

        def __call__(self, x):
            return jax.vmap(lambda r: self.l2(jax.nn.relu(self.l1(r))))(x)

    model = MLP(jax.random.PRNGKey(0))
    specs = jax.tree.map(lambda _: None, model)
    specs = eqx.tree_at(lambda m: (m.l1.weight, m.l1.bias, m.l2.weight), specs,
                        (P("y", None), P("y"), P(None, "y")), is_leaf=lambda v: v is None)
    f = gp.spmd(lambda m, x: m(x), mesh, in_shardings=(specs, P("x", None)))
    x = arr(16, 8, seed=4)
    p = f.plan(model, x)
    assert shardy(p, "arg0.l1.weight") == "[{y}, {}]" and shardy(p, "arg0.l2.weight") == "[{}, {y}]"
    np.testing.assert_allclose(np.asarray(f(model, x)), model(x), rtol=1e-5, atol=1e-5)
    # a model with a function inside: the error names the leaf and says what to do
    mlp = eqx.nn.MLP(4, 4, 8, 1, key=jax.random.PRNGKey(1))
    with pytest.raises(gp.AnnotationError, match=r"arg0\.activation is .*eqx\.partition"):
        gp.spmd(lambda m, x: m(x), mesh).plan(mlp, f32(4))


@pytest.mark.slow
def test_nnx_state_as_argument_and_spec_tree(mesh):
    nnx = pytest.importorskip("flax.nnx")

    class Model(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(8, 32, rngs=rngs)
            self.l2 = nnx.Linear(32, 8, rngs=rngs)

        def __call__(self, x):
            return self.l2(jax.nn.relu(self.l1(x)))

    graphdef, state = nnx.split(Model(nnx.Rngs(0)))

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)

    specs = jax.tree.map(lambda _: None, state)
    specs["l1"]["kernel"] = nnx.Param(P(None, "y"))
    specs["l2"]["kernel"] = nnx.Param(P("y", None))
    f = gp.spmd(apply, mesh, in_shardings=(specs, P("x", None)))
    x = arr(16, 8, seed=5)
    p = f.plan(state, x)
    assert shardy(p, "arg0['l1']['kernel'].value") == "[{}, {y}]"
    assert shardy(p, "arg0['l2']['kernel'].value") == "[{y}, {}]"
    np.testing.assert_allclose(np.asarray(f(state, x)), apply(state, x), rtol=1e-5, atol=1e-5)
    # a plain nested dict of specs for an nnx.State: matched by key
    p2 = gp.spmd(apply, mesh, in_shardings=({"l1": {"kernel": P(None, "y"), "bias": None},
                                              "l2": {"kernel": None, "bias": None}}, None)).plan(state, x)
    assert shardy(p2, "arg0['l1']['kernel'].value") == "[{}, {y}]"
