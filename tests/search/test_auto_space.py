"""The space gp.auto_shard searches: the start states experts write (FSDP / ZeRO-3, data
parallel + FSDP, expert, sequence + Megatron, spatial tiling over two dims), weights found on
either operand of a dot through casts, transposes and scans, a parameter's gradient, update
and new value following its layout, and memory limits that only FSDP-like plans meet."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp
from models import block_grad, block_shapes, conv_net

S = jax.ShapeDtypeStruct
P = gp.P
HW = gp.Hardware.preset("h100-node")
f32 = jnp.float32


def _search(fn, mesh, *args, **kw):
    kw.setdefault("hardware", HW)
    kw.setdefault("max_evaluations", 80)
    kw.setdefault("time_budget_s", 600)
    return gp.auto_shard(fn, mesh, *args, **kw)


def _stack_step(x, y, w1, w2):
    """A scanned 4-layer MLP stack's SGD step (weights [L, d, f], [L, f, d])."""
    def loss(w1, w2):
        def layer(h, w):
            return jax.nn.relu(h @ w[0]) @ w[1], None
        return jnp.mean((lax.scan(layer, x, (w1, w2))[0] - y) ** 2)

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2


STACK = (S((4096, 512), f32), S((4096, 512), f32), S((4, 512, 1024), f32), S((4, 1024, 512), f32))


def _axes(spec):
    return {a for e in spec for a in ((e,) if isinstance(e, str) else (e or ()))}


def test_memory_limit_only_fsdp_like_plans_meet():
    """At 30 MiB per device no hand plan fits (FSDP: 36 MiB, data parallel 57, Megatron 109):
    the search starts from FSDP and returns an FSDP-like plan (batch over both axes, weights and
    their updates kept sharded alike) instead of raising MemoryLimitError (as it did: its
    smallest plan was 35 MiB)."""
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))
    limit = 30 * 2 ** 20
    res = _search(_stack_step, mesh, *STACK, memory_limit=limit)
    assert res.cost.peak_memory_bytes <= limit
    base = dict(res.search.baselines)
    assert "FSDP (x,y)" in base and not any(c.fits for c in base.values())
    x, y, w1, w2 = res.in_shardings
    assert _axes(x) == {"x", "y"} and _axes(y) == {"x", "y"}
    assert _axes(w1) and _axes(w2) and {"x", "y"} in (_axes(w1), _axes(w2))  # weights kept sharded
    assert res.out_shardings == (w1, w2)  # the updated weights too, alike (not gathered)


def test_fsdp_start_state_shards_weights_and_their_updates():
    from models import sgd_step

    mesh = gp.Mesh.abstract((8,), ("m",))
    params = {"w1": S((256, 512), f32), "w2": S((512, 256), f32)}
    res = _search(sgd_step, mesh, params, S((64, 256), f32), S((64, 256), f32))
    base = dict(res.search.baselines)
    fsdp = base["FSDP (m)"]
    assert "arg0['w1'] dim 1 on m" in fsdp.text and "arg0['w2'] dim 0 on m" in fsdp.text, fsdp.text
    assert "arg1 dim 0 on m" in fsdp.text and "arg2 dim 0 on m" in fsdp.text, fsdp.text
    # the updated parameters belong to their weight's class: sharded alike
    cls = [c for c in res.search.classes if c.what == "arg0['w1']"][0]
    assert cls.roots == 1 and len(cls.values) > 1


def test_weight_as_left_operand_and_transposed_tied_weight():
    def f(x, w0, w, wte):
        h = jax.nn.relu(x @ w0)  # [b, f]
        h = lax.dot_general(w, h, (((0,), (1,)), ((), ())))  # [d, b]: the weight first, an activation second
        return h.T @ wte.T  # a tied embedding used transposed: [b, v]

    mesh = gp.Mesh.abstract((8,), ("m",))
    res = _search(f, mesh, S((16, 256), f32), S((256, 1024), f32), S((1024, 512), f32), S((2048, 512), f32))
    meg = dict(res.search.baselines)["Megatron (m)"]
    # w0 column-parallel (dim 1), w row-parallel (its contracting dim 0), wte.T column-parallel (wte's vocab dim 0)
    assert meg.text == "arg1 dim 1 on m; arg2 dim 0 on m; arg3 dim 0 on m", meg.text
    assert res.cost.step_s <= meg.price.step_s * (1 + 1e-9)


def test_expert_parallel_start_state():
    def moe(x, wi, wo):  # x [e, c, m] already dispatched to experts
        return jnp.einsum("ech,ehm->ecm", jax.nn.relu(jnp.einsum("ecm,emh->ech", x, wi)), wo)

    mesh = gp.Mesh.abstract((8,), ("m",))
    res = _search(moe, mesh, S((8, 64, 128), f32), S((8, 128, 512), f32), S((8, 512, 128), f32))
    base = dict(res.search.baselines)
    ex = base["expert parallel (m)"]
    assert "arg1 dim 0 on m" in ex.text and "arg2 dim 0 on m" in ex.text and "arg0 dim 0 on m" in ex.text, ex.text
    assert res.cost.step_s <= ex.price.step_s * (1 + 1e-9)


def test_sequence_parallel_start_state():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))
    res = _search(block_grad, mesh, *[S(s, f32) for s in block_shapes(b=4, t=32)])
    base = dict(res.search.baselines)
    seq = base["Megatron + sequence parallel (y)"]
    assert "arg0 dim 1 on y" in seq.text and "arg0 dim 0 on x" in seq.text, seq.text
    assert res.cost.step_s <= min(c.price.step_s for c in base.values()) * (1 + 1e-9)


def test_spatial_tiling_over_two_dims_start_state_runs():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    rng = np.random.default_rng(0)
    args = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in [(2, 32, 32, 8), (3, 3, 8, 8), (3, 3, 8, 8)]]
    res = _search(conv_net, mesh, *args)
    base = dict(res.search.baselines)
    hw = base["spatial (H x, W y)"]
    assert hw.text == "arg0 dim 1 on x; arg0 dim 2 on y", hw.text
    assert "spatial (batch x, H y)" in base
    assert res.cost.step_s <= hw.price.step_s * (1 + 1e-9)
    np.testing.assert_allclose(np.asarray(res.spmd(*args)), np.asarray(conv_net(*args)), rtol=1e-4, atol=1e-4)


def test_report_sets_the_plan_beside_every_hand_plan_and_says_why():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))
    args = (S((4096, 512), f32), S((512, 2048), f32), S((2048, 512), f32))
    from models import mlp

    res = _search(mlp, mesh, *args)
    text = res.report()
    for name in ("replicated", "data parallel (x,y)", "FSDP (x,y)", "Megatron (y)", "data parallel (x) + Megatron (y)",
                 "2D (x,y)"):
        assert f"hand: {name} " in text, name
    assert "why this plan: step" in text and "compute" in text and "communication" in text
    assert "dominant terms: " in text and "dot_general" in text
    assert ("vs the best hand-written plan that fits" in text) or ("it is the hand-written plan" in text)
    assert "tactics=res.rules()" in text
