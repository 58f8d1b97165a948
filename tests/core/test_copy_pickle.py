"""Every public value class survives copy.copy, copy.deepcopy and pickle: equal after the round
trip, same hash, and behaving the same (the same Sharding built from a spec, the same plan from a
gp.spmd function, the same cost from a Hardware). The classes are enumerated from the package's
public names (gp, gp.tactics, gp.testing), so a new public class fails
``test_every_public_class_has_examples`` until it gets a strategy here. A gp.Plan does not
pickle (it holds the traced jaxpr): pickling one, or a gp.AutoResult, is a NotPicklableError
that says what to pickle instead."""
from __future__ import annotations

import copy
import os
import pickle
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, strategies as st

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.core.errors import NotPicklableError

P = gp.P
S = jax.ShapeDtypeStruct
ARGS = (S((8, 16), jnp.float32), S((16, 32), jnp.float32), S((32, 16), jnp.float32))
PATHS = [(jax.tree_util.DictKey("attn"), jax.tree_util.GetAttrKey("kernel")), (jax.tree_util.SequenceKey(0),),
         (jax.tree_util.DictKey("mlp"), jax.tree_util.DictKey("bias"))]
KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def public_classes() -> dict[str, type]:
    """The classes among the public names of gp, gp.tactics and gp.testing (``__all__``, or the
    names a module defines itself where it has none)."""
    out = {}
    for mod in (gp, gp.tactics, gp.testing):
        names = getattr(mod, "__all__", None) or [
            n for n in dir(mod) if not n.startswith("_") and getattr(getattr(mod, n), "__module__", "") == mod.__name__]
        for n in names:
            obj = getattr(mod, n)
            if isinstance(obj, type) and obj.__module__.startswith("gspmd_py"):
                out[f"{mod.__name__}.{n}"] = obj
    return out


class World(dict):
    def __repr__(self) -> str:  # hypothesis prints the test's arguments
        return "<world: a plan, an auto_shard result, placements>"


@pytest.fixture(scope="module")
def world():
    """What the strategies draw from that takes planning: a plan, a search's result, placements."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    plan = gp.spmd(mlp, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None))).plan(*ARGS)
    hw = gp.Hardware.preset("h100-node")
    auto = gp.auto_shard(mlp, mesh, *ARGS, hardware=hw, max_evaluations=20)
    placements = gp.rank_meshes(mlp, (2, 4), ("x", "y"), hw, *ARGS, in_shardings=(P("x", None), None, None))
    return World(plan=plan, auto=auto, placements=placements)


def _specs(mesh, max_rank=3):
    return st.lists(st.integers(1, 12), max_size=max_rank).flatmap(lambda shape: gpt.shardings(tuple(shape), mesh))


def _axis_refs(mesh):
    return _specs(mesh).map(lambda p: gp.Sharding(mesh, p).used_axes or (mesh.ref(mesh.axis_names[0]),)).flatmap(
        st.sampled_from)


@st.composite
def _shardings(draw, mesh):
    s = gp.Sharding(mesh, draw(_specs(mesh)))
    free = [n for n in mesh.axis_names if not any(mesh.ref(n).overlaps(a) for a in s.used_axes)]
    partial = draw(st.lists(st.sampled_from(free), unique=True)) if free else []
    return gp.Sharding(mesh, s.spec, partial=partial)


@st.composite
def _rules(draw, mesh):
    pats = st.sampled_from(["*", "*attn*/kernel", "mlp/*", "0", re.compile(r"bias$"), re.compile("kernel")])
    pairs = draw(st.lists(st.tuples(pats, st.one_of(st.none(), _specs(mesh, 2))), max_size=4))
    return gp.rules(pairs, unmatched=draw(st.sampled_from(["error", "warn", "ignore"])))


def _hardware():
    return st.sampled_from([gp.Hardware.preset("tpu-v4"), gp.Hardware.preset("h100-node"),
                            gp.Hardware.preset("a100-node", node_size=4)])


def _axis(mesh):
    return st.sampled_from(mesh.axis_names)


def _argnums():
    return st.one_of(st.none(), st.sampled_from([0, (0, 1), (2,)]))


@st.composite
def _decided(draw, mesh):
    dims = draw(st.lists(st.tuples(st.integers(0, 9), st.one_of(st.none(), st.just((8, 16))),
                                   st.tuples(st.tuples(*[_axis(mesh)] * 1), st.just(()))), max_size=3))
    return gp.tactics.Decided(tuple(dims), text=draw(st.sampled_from(["auto", "auto('x')"])))


@st.composite
def _collectives(draw, mesh):
    axes = tuple(draw(st.lists(_axis(mesh), unique=True, min_size=1)))
    return gp.Collective(draw(st.sampled_from(KINDS)), axes, draw(st.integers(0, 2**40)), draw(st.text(max_size=12)),
                         op_id=draw(st.integers(-1, 99)), dtype="float32", shape=(4, 8), reduce="sum",
                         tensors=draw(st.integers(1, 4)), group_size=4, in_loop=draw(st.booleans()))


def _spmd(mesh):
    tactics = st.sampled_from([None, [gp.tactics.zero(mesh.axis_names[-1], argnums=(1, 2))]])
    return st.tuples(_specs(mesh, 2), st.sampled_from([(), (0,)]), st.sampled_from([None, 0, 1 << 20]), tactics,
                     st.one_of(st.none(), _hardware())).map(
        lambda t: gp.spmd(mlp, mesh, in_shardings=(t[0], None, None), donate_argnums=t[1],
                          combine_threshold_bytes=t[2], tactics=t[3], hardware=t[4]))


# class -> (strategy of instances on a drawn mesh, what it does: compared before and after)
EXAMPLES = {
    gp.P: (_specs, lambda p, m: gp.Sharding(m, p)),
    gp.Mesh: (lambda m: st.sampled_from([m, gp.Mesh.abstract(m.shape, m.axis_names)]),
              lambda x, m: (gp.Sharding(x, P(x.axis_names[0])), x.is_abstract, x.device_ids.tolist())),
    gp.AxisRef: (_axis_refs, lambda a, m: gp.Sharding(m, P(a))),
    gp.Sharding: (_shardings, lambda s, m: (str(s), s.spec, s.tile_assignment.tolist(), s.shardy())),
    gp.Rules: (_rules, lambda r, m: [r.matches(p) for p in PATHS]),
    gp.Collective: (_collectives, lambda c, m: str(c)),
    gp.Hardware: (lambda m: _hardware(), lambda h, m, w: w["plan"].cost(h).step_s),
    gp.Link: (lambda m: st.builds(gp.Link, st.floats(0, 1e-3), st.floats(1e6, 1e12), st.sampled_from(["", "ici"]),
                                  st.sampled_from(["switch", "ring"]),
                                  st.lists(st.tuples(st.sampled_from(KINDS), st.floats(0, 1), st.floats(1, 1e9)),
                                           max_size=2).map(tuple)),
              lambda link, m: [link.for_kind(k) for k in KINDS]),
    gp.Cost: (lambda m: _hardware().map(lambda h: ("cost", h)), lambda c, m: c.table()),
    gp.Schedule: (lambda m: st.builds(gp.Schedule, st.integers(1, 8), st.integers(1, 16), st.integers(1, 3)),
                  lambda s, m: (str(s), s.iterations, s.bubble)),
    gp.Placement: (lambda m: st.integers(0, 1).map(lambda i: ("placement", i)), lambda p, m: (str(p), p.mesh())),
    gp.Spmd: (_spmd, lambda f, m: (f.plan(*ARGS).spmd_text(), f.plan(*ARGS).in_shardings)),
    gp.AutoResult: (lambda m: st.just(("auto",)), lambda r, m: (r.plan.spmd_text(), r.in_shardings, r.rules())),
    gp.Plan: (lambda m: st.just(("plan",)), lambda p, m: p.spmd_text()),
    gp.tactics.Batch: (lambda m: st.builds(gp.tactics.batch, _axis(m), _argnums()), lambda t, m: str(t)),
    gp.tactics.Zero: (lambda m: st.builds(gp.tactics.zero, _axis(m), _argnums()), lambda t, m: str(t)),
    gp.tactics.Pipeline: (lambda m: st.builds(gp.tactics.pipeline, _axis(m), microbatches=st.integers(1, 8)),
                          lambda t, m: str(t)),
    gp.tactics.Auto: (lambda m: st.builds(gp.tactics.auto, _axis(m), hardware=st.one_of(st.none(), _hardware()),
                                          seed=st.integers(0, 9)), lambda t, m: (str(t), t.axes)),
    gp.tactics.Rules: (lambda m: _rules(m).map(gp.tactics.rules), lambda t, m: [t.rules.matches(p) for p in PATHS]),
    gp.tactics.Decided: (_decided, lambda t, m: (str(t), t.axes)),
    gp.testing.Annotation: (lambda m: st.builds(gp.testing.Annotation, _specs(m), st.integers(0, 2)),
                            lambda a, m: a.source("x")),
    gp.testing.Case: (lambda m: _specs(m, 2).map(lambda p: gp.testing.Case(mlp, m, ARGS, (p, None, None))),
                      lambda c, m: repr(c)),
    gp.testing.Program: (lambda m: gpt.programs(st.just(m)), lambda p, m: (repr(p), p.gpt_name)),
}
NOT_PICKLED = (gp.Plan, gp.AutoResult)  # pickling says NotPicklableError; copies work
# compared by what they do alone: a gp.spmd function is a function (equal to itself only), a
# gpt.Case holds arrays (== is ambiguous)
BY_BEHAVIOUR = (gp.Spmd, gp.testing.Case)


def _materialise(x, world):
    """The strategies' stand-ins for objects that take planning, replaced by the world's."""
    if isinstance(x, tuple) and x and isinstance(x[0], str):
        kind = x[0]
        if kind == "cost":
            return world["plan"].cost(x[1])
        if kind == "placement":
            return world["placements"][x[1]]
        if kind in ("auto", "plan"):
            return world[kind]
    return x


def _behaviour(cls, obj, mesh, world):
    fn = EXAMPLES[cls][1]
    return fn(obj, mesh, world) if fn.__code__.co_argcount == 3 else fn(obj, mesh)


def _hash(x):
    try:
        return hash(x)
    except TypeError:  # a frozen value holding a dict (gp.AutoResult's search)
        return None


def _pickled(x):
    return pickle.loads(pickle.dumps(x))


def test_every_public_class_has_examples():
    missing = [name for name, cls in public_classes().items()
               if not issubclass(cls, BaseException) and cls not in EXAMPLES]
    assert not missing, f"public classes with no copy / pickle examples here: {missing}"


@pytest.mark.parametrize("cls", list(EXAMPLES), ids=lambda c: c.__qualname__)
@given(data=st.data())
def test_value_round_trips(world, cls, data):
    mesh = data.draw(gpt.meshes(max_axes=2), label="mesh")
    obj = _materialise(data.draw(EXAMPLES[cls][0](mesh), label=cls.__name__), world)
    assert isinstance(obj, cls)
    before = _behaviour(cls, obj, mesh, world)
    trips = [copy.copy, copy.deepcopy] + ([] if cls in NOT_PICKLED else [_pickled])
    for trip in trips:
        got = trip(obj)
        assert type(got) is type(obj), trip
        if cls not in BY_BEHAVIOUR:
            assert got == obj and _hash(got) == _hash(obj) and repr(got) == repr(obj), (trip, obj, got)
        assert _behaviour(cls, got, mesh, world) == before, trip
    if cls in NOT_PICKLED:
        with pytest.raises(NotPicklableError, match="pickle"):
            pickle.dumps(obj)


def test_spec_copies_keep_their_entries():
    """The red team's case: the tuple's own reduction made P("x", None, "y") a one-entry spec."""
    for p in (P("x", None, "y"), P("x", "y"), P(("x", "y"), None), P()):
        for got in (copy.copy(p), copy.deepcopy(p), _pickled(p)):
            assert type(got) is P and tuple(got) == tuple(p) and len(got) == len(p)


@pytest.mark.parametrize("err", [c for c in public_classes().values() if issubclass(c, BaseException)],
                         ids=lambda c: c.__name__)
def test_errors_round_trip_with_their_message(err):
    e = err("mesh axis 'y' is used on dims 0 and 1")
    for got in (copy.copy(e), copy.deepcopy(e), _pickled(e)):
        assert type(got) is err and str(got) == str(e) and got.args == e.args


def test_plan_copies_are_itself_and_pickle_says_why(world):
    plan = world["plan"]
    assert copy.copy(plan) is plan and copy.deepcopy(plan) is plan
    with pytest.raises(NotPicklableError, match=r"gp\.spmd function.*in_shardings") as info:
        pickle.dumps(plan)
    assert isinstance(info.value, gp.ShardingError) and isinstance(info.value, TypeError)


def test_search_result_pickles_as_data_and_replays(world, mesh):
    res = world["auto"]
    with pytest.raises(NotPicklableError, match=r"res\.rules\(\)"):
        pickle.dumps(res)
    rules, ins, outs = _pickled((res.rules(), res.in_shardings, res.out_shardings))
    assert (rules, ins, outs) == (res.rules(), res.in_shardings, res.out_shardings)
    f = gp.spmd(mlp, mesh, in_shardings=ins, out_shardings=outs, tactics=rules)
    assert f.plan(*ARGS).spmd_text() == res.plan.spmd_text()


_OTHER_PROCESS = """
import pickle, sys, re
import gspmd_py as gp
m = gp.Mesh((2, 4), ("x", "y"))
objs = [gp.P("x", None, "y"), m, gp.Mesh.abstract((4, 2), ("a", "b")), m.ref("y:(2)2"),
        gp.Sharding(m, gp.P(("x", "y:(1)2"), None), partial=()), gp.Sharding(m, gp.P(None, "y"), partial=["x"]),
        gp.rules([("*kernel", gp.P(None, "y")), (re.compile("b$"), None)], unmatched="warn"),
        gp.tactics.rules([("*", gp.P("x"))]), gp.Hardware.preset("tpu-v4"), gp.tactics.batch("x")]
sys.stdout.buffer.write(pickle.dumps(objs))
"""


@pytest.mark.slow
def test_pickles_load_in_a_process_with_another_hash_seed():
    """A hash cached in the object (Sharding, gp.rules) is of its process's string hashes: loaded
    in another process, the objects must hash as those built there (dict keys, plan caches)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", _OTHER_PROCESS], capture_output=True, env=env, cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    theirs = pickle.loads(r.stdout)
    ns: dict = {}
    exec(_OTHER_PROCESS.replace("sys.stdout.buffer.write(pickle.dumps(objs))", ""), ns)
    for got, mine in zip(theirs, ns["objs"], strict=True):
        assert got == mine and hash(got) == hash(mine), (got, mine)
        assert {mine: 1}.get(got) == 1
