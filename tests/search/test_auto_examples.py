"""gp.auto_shard on the examples' models (examples/flax_gpt.py: a GPT with a tied embedding and
momentum SGD; examples/spatial_conv.py: a conv net with Adam): the plan replays as data (the same
program from res.in_shardings / res.out_shardings / res.rules()) and computes what jax.jit does."""
import importlib.util
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import gspmd_py as gp

HW = gp.Hardware.preset("h100-node")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def _example(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # flax dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _check(step, args):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    res = gp.auto_shard(step, mesh, *args, hardware=HW, max_evaluations=40, time_budget_s=600)
    f = gp.spmd(step, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings, tactics=res.rules())
    assert f.plan(*args).spmd_text() == res.plan.spmd_text()
    got, want = f(*args), jax.jit(step)(*args)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    return res


def test_flax_gpt_example():
    ex = _example("flax_gpt")
    model = ex.GPT(layers=1)
    # SGD with momentum, not the example's AdamW: the key bias's gradient is exactly zero in exact
    # arithmetic (softmax ignores a per-row constant), and Adam would blow its rounding noise up to +-lr
    tx = optax.sgd(1e-2, momentum=0.9)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, model.length), jnp.int32))["params"]
    tokens = next(ex.batches(1, 8, model.length, model.vocab))
    res = _check(ex.make_step(model, tx), (params, tx.init(params), tokens))
    assert any("FSDP" in n for n, _ in res.search.baselines)


def test_spatial_conv_example():
    ex = _example("spatial_conv")
    model = ex.ConvNet()
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 16, 16, 3)).astype(np.float32)
    labels = (images.mean(axis=(1, 2, 3)) > 0).astype(np.int32)
    params = model.init(jax.random.PRNGKey(0), images[:1])["params"]
    tx = optax.adam(3e-3)

    def train_step(params, opt_state, images, labels):
        def loss_fn(p):
            return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, images), labels).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    _check(train_step, (params, tx.init(params), images, labels))
