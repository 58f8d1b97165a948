"""Red team round 4 (issue 25), runtime layer: arrays plan.place padded carry their logical
shape back into the call (never computed on as data), and plans evicted from a gp.spmd
function's cache free what they held (RSS stays flat; long form: GSPMD_PY_MEMORY=1)."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st

import gspmd_py as gp
from gspmd_py.runtime.placed import logical_shape
from partition_util import assert_same, examples, meshes, rand, shapes, spec_for

_FNS = {
    "mean of the last dim": lambda x: x.mean(axis=-1),
    "sum": lambda x: x.sum(),
    "max": lambda x: x.max(axis=0),
    "scaled": lambda x: x * 2.0 + 1.0,
}


@examples(12)
@given(mesh=meshes(), shape=shapes(1, 3), fn=st.sampled_from(sorted(_FNS)), data=st.data())
def test_placed_uneven_inputs_compute_as_the_original(mesh, shape, fn, data):
    """plan.place pads an uneven input (the compiled program's argument); plan.run of it,
    the gp.spmd function called with it, and a second function laid out otherwise called
    with it all equal the unpartitioned function of the unpadded input."""
    spec = data.draw(spec_for(mesh, len(shape)))
    other = data.draw(spec_for(mesh, len(shape)))
    x = rand(shape)
    want = _FNS[fn](x)
    f = gp.spmd(_FNS[fn], mesh, in_shardings=(spec,))
    plan = f.plan(x)
    placed = plan.place([x])
    assert placed[0].shape == plan.padded_in_shapes[0]
    assert_same(plan.run(placed), want, what="plan.run(placed)")
    assert_same(f(*placed), want, what="f(*placed)")
    assert_same(f(*placed), want, what="f(*placed), the fast path")
    assert f.plan(*placed) is plan
    g = gp.spmd(_FNS[fn], mesh, in_shardings=(other,))
    assert_same(g(*placed), want, what="g(*placed), another layout")
    assert_same(g.plan(x).run(placed), want, what="g's plan.run(placed)")


def test_placed_array_of_padded_shape_is_not_the_padded_data():
    """The smallest form from the issue: f32[16,74] over 8 devices places as f32[16,80];
    called with it, the mean over dim 1 was 74/80 of the right value."""
    mesh = gp.Mesh((8,), ("x",))
    x = rand((16, 74))
    f = gp.spmd(lambda a: a.mean(axis=1), mesh, in_shardings=(gp.P(None, "x"),))
    placed = f.plan(x).place([x])
    assert placed[0].shape == (16, 80) and logical_shape(placed[0]) == (16, 74)
    assert_same(f(*placed), x.mean(axis=1))
    assert_same(jax.jit(lambda a: f(a) * 1.0)(x), x.mean(axis=1))
    # placed again (already padded, marked): kept, still the logical array
    again = f.plan(x).place(placed)
    assert again[0] is placed[0]
    assert_same(f(*again), x.mean(axis=1))
    # a padded array the user made is data of its own shape, as under jax.jit
    mine = jnp.zeros((16, 80)).at[:, :74].set(x)
    assert_same(f(mine), np.asarray(mine).mean(axis=1))


def _rss_mib() -> float:
    """Resident set size from /proc/self/statm (no psutil)."""
    import os

    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def test_replanning_more_shapes_than_the_cache_holds_frees_evicted_plans(monkeypatch):
    """Issue 25: 80 shapes cycling through a 64-plan cache grew RSS by ~110 MB: an evicted plan
    (a graph of reference cycles) waited for a rare full collection, so up to twice the cache's
    plans stayed alive. Now at most a quarter cache of evicted plans is alive at any time and RSS
    stays flat. Short form (cache 4, 12 shapes, 3 rounds); GSPMD_PY_MEMORY=1: cache 64, 80 shapes,
    6 rounds. No gc.collect() here: the point is what happens without one."""
    import os
    import weakref

    from gspmd_py.api import api

    long_form = bool(os.environ.get("GSPMD_PY_MEMORY"))
    cache, n_shapes, rounds = (64, 80, 6) if long_form else (4, 12, 3)
    monkeypatch.setattr(api, "PLAN_CACHE_SIZE", cache)
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(lambda a, w: jnp.tanh(a @ w).sum(0), mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    w = np.ones((16, 32), np.float32)
    xs = [np.full((8 + i, 16), 0.01 * i, np.float32) for i in range(n_shapes)]
    refs, alive, rss = [], [], []
    for _ in range(rounds):
        for x in xs:
            out = f(x, w)
            refs.append(weakref.ref(f.plan(x, w)))
            alive.append(sum(r() is not None for r in refs))
        rss.append(_rss_mib())
    np.testing.assert_allclose(np.asarray(out), np.tanh(xs[-1] @ w).sum(0), rtol=1e-5)
    assert max(alive) <= cache + cache // 2 + 1, f"plans alive at once: up to {max(alive)} for a cache of {cache}"
    grown = rss[-1] - rss[0]  # from the end of the first round (warm: the cache full, the heap sized)
    assert grown < (64 if long_form else 40), f"RSS grew {grown:.0f} MiB over {rounds - 1} rounds of re-plans: {rss}"
