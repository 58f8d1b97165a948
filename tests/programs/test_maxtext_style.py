"""A decoder written as MaxText writes it, partitioned by gspmd_py and by jax.jit alike.

Scanned decoder layers (``nn.scan``) under ``nn.remat`` with a ``save_only_these_names``
policy, every layer's activations named with ``checkpoint_name``, parameters and
activations given logical axes that ``logical_axis_rules`` map onto the mesh, and a
training step (loss, grads, SGD update). gspmd_py's step must equal jax.jit's with the
same NamedShardings, on the oldest and the newest JAX.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding

import gspmd_py as gp

nn = pytest.importorskip("flax.linen")

RULES = (("batch", "x"), ("embed", None), ("mlp", "y"), ("heads", "y"), ("kv", None), ("vocab", "y"),
         ("length", None), ("layers", None))
D, H, K, F, V, L = 16, 4, 4, 32, 64, 3


class DecoderLayer(nn.Module):
    @nn.compact
    def __call__(self, x, _):
        init = nn.initializers.normal(0.2)
        y = nn.LayerNorm(use_bias=False, scale_init=nn.initializers.ones)(x)
        y = nn.with_logical_constraint(y, ("batch", "length", "embed"))
        qkv = self.param("qkv", nn.with_logical_partitioning(init, ("embed", "heads", "kv")), (D, 3 * H, K))
        q, k, v = jnp.split(jnp.einsum("btd,dhk->bthk", y, qkv), 3, axis=2)
        q, k, v = (checkpoint_name(t, n) for t, n in ((q, "query_proj"), (k, "key_proj"), (v, "value_proj")))
        att = jax.nn.softmax(jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(K), axis=-1)
        o = checkpoint_name(jnp.einsum("bhts,bshk->bthk", att, v), "attention_out")
        out = self.param("out", nn.with_logical_partitioning(init, ("heads", "kv", "embed")), (H, K, D))
        x = x + jnp.einsum("bthk,hkd->btd", o, out)
        y = nn.LayerNorm(use_bias=False, scale_init=nn.initializers.ones)(x)
        wi = self.param("wi", nn.with_logical_partitioning(init, ("embed", "mlp")), (D, F))
        wo = self.param("wo", nn.with_logical_partitioning(init, ("mlp", "embed")), (F, D))
        h = checkpoint_name(jax.nn.gelu(y @ wi), "mlpwi")
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        x = x + h @ wo
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class Decoder(nn.Module):
    @nn.compact
    def __call__(self, ids):
        emb = self.param("embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0), ("vocab", "embed")),
                         (V, D))
        x = emb[ids]
        policy = jax.checkpoint_policies.save_only_these_names("query_proj", "value_proj", "mlpwi")
        layer = nn.remat(DecoderLayer, policy=policy, prevent_cse=False)
        x, _ = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True}, length=L,
                       metadata_params={nn.PARTITION_NAME: "layers"})()(x, None)
        return x @ emb.T


def _loss(params, ids, labels):
    logits = Decoder().apply({"params": params}, ids)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1))


def _step(params, ids, labels):
    loss, grads = jax.value_and_grad(_loss)(params, ids, labels)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss


def test_maxtext_style_training_step_equals_jax_jit():
    ids = jnp.asarray(np.random.default_rng(0).integers(0, V, (8, 6)), jnp.int32)
    labels = jnp.roll(ids, -1, axis=1)
    jm = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    with nn.logical_axis_rules(RULES):
        boxed = Decoder().init(jax.random.key(0), ids)["params"]
        specs = nn.get_partition_spec(boxed)
        shardings = nn.logical_to_mesh_sharding(specs, jm, RULES)
        params = nn.unbox(boxed)
        data = NamedSharding(jm, jax.sharding.PartitionSpec("x", None))
        ref = jax.jit(_step, in_shardings=(shardings, data, data), out_shardings=(shardings, None))(params, ids, labels)
        f = gp.spmd(_step, jm, in_shardings=(shardings, data, data), out_shardings=(shardings, None))
        out = f(params, ids, labels)
        plan = f.plan(params, ids, labels)
    np.testing.assert_allclose(out[1], ref[1], rtol=2e-5)
    for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(ref[0])):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    # the updated parameters come back laid out as the logical rules say (as jax.jit returns them)
    for a, s in zip(jax.tree.leaves(out[0]), jax.tree.leaves(shardings)):
        assert a.sharding.is_equivalent_to(s, a.ndim)
    # no op of the step (names, remat, scan, embedding lookup, tied logits) fell back to a
    # replicated computation
    assert plan.diagnostics.fallbacks == ()
