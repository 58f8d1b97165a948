"""A Flax (linen) GPT trained with optax adamw (global-norm clipping) under gp.spmd.

Megatron tensor parallelism on mesh axis "y" (attention heads, the MLP's hidden units) times
data parallelism on "x" of a (2, 4) mesh, given by NAME with gp.rules: the same rules shard
the parameters, adamw's moments (their key paths end like the parameters') and the updated
parameters the step returns. Each step's loss is printed beside the unpartitioned run's.

    python examples/flax_gpt.py [--steps 10] [--html plan.html]
"""
from __future__ import annotations

import argparse
import os
import sys

if "jax" not in sys.modules:  # 8 CPU devices for the (2, 4) mesh, before jax is imported
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import gspmd_py as gp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _compare import compare  # noqa: E402

P = gp.P


class Block(nn.Module):
    heads: int
    head_dim: int
    hidden: int

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        h = nn.LayerNorm(name="ln1")(x)
        q, k, v = (nn.DenseGeneral((self.heads, self.head_dim), name=n)(h) for n in ("query", "key", "value"))
        s = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(self.head_dim).astype(np.float32)
        t = x.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
        att = gp.tag(jax.nn.softmax(s, axis=-1), "attention")
        o = jnp.einsum("bhts,bshk->bthk", att, v)
        x = x + nn.DenseGeneral(d, axis=(-2, -1), name="out")(o)
        h = nn.gelu(nn.Dense(self.hidden, name="up")(nn.LayerNorm(name="ln2")(x)))
        return x + nn.Dense(d, name="down")(gp.tag(h, "mlp_hidden"))


class GPT(nn.Module):
    vocab: int = 64
    length: int = 16
    dim: int = 32
    heads: int = 4
    layers: int = 2

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(self.vocab, self.dim, name="embed")
        pos = self.param("pos", nn.initializers.normal(0.02), (self.length, self.dim))
        x = embed(tokens) + pos[: tokens.shape[1]]
        for i in range(self.layers):
            x = Block(self.heads, self.dim // self.heads, 4 * self.dim, name=f"block_{i}")(x)
        return embed.attend(nn.LayerNorm(name="ln_f")(x))  # tied output embedding


# Megatron x data parallel, by name: first match wins; anything else is left to propagation
RULES = gp.rules([
    ("*/query/kernel", P(None, "y", None)), ("*/key/kernel", P(None, "y", None)),
    ("*/value/kernel", P(None, "y", None)),                   # column parallel: heads over y
    ("*/query/bias", P("y", None)), ("*/key/bias", P("y", None)), ("*/value/bias", P("y", None)),
    ("*/out/kernel", P("y", None, None)),                     # row parallel
    ("*/up/kernel", P(None, "y")), ("*/up/bias", P("y")),    # column parallel
    ("*/down/kernel", P("y", None)),                          # row parallel
])


def make_step(model, tx):
    def loss_fn(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def train_step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step


def batches(steps: int, batch: int, length: int, vocab: int, seed: int = 0):
    """Sequences that count up by a random stride mod vocab: learnable, so the loss falls."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        start = rng.integers(0, vocab, (batch, 1))
        stride = rng.integers(1, 4, (batch, 1))
        yield ((start + stride * np.arange(length + 1)) % vocab).astype(np.int32)


def main(argv=None, *, steps: int = 10, batch: int = 8, layers: int = 2) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--html", default=None, help="write the plan's HTML page here")
    args = ap.parse_args(argv)

    model = GPT(layers=layers)
    mesh = gp.Mesh((2, 4), ("x", "y"))
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.01))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, model.length), jnp.int32))["params"]
    opt_state = tx.init(params)
    step = make_step(model, tx)

    # in: (parameters, optimizer state, tokens); out: (parameters, optimizer state, loss)
    spmd_step = gp.spmd(step, mesh, in_shardings=(RULES, RULES, P("x", None)),
                        out_shardings=(RULES, RULES, None))
    plain_step = jax.jit(step)

    data = list(batches(args.steps, batch, model.length, model.vocab))
    plan = spmd_step.plan(params, opt_state, data[0])
    kinds = {}
    for c in plan.collectives:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    print(f"GPT ({sum(x.size for x in jax.tree.leaves(params)):,} parameters) on {mesh}: "
          f"{len(plan.collectives)} collectives per step {kinds}, {len(plan.fallbacks)} replicated fallbacks")
    ins = plan.in_shardings[0]["block_0"]
    print(f"query kernel {ins['query']['kernel'].spec}, out kernel {ins['out']['kernel'].spec}, "
          f"up kernel {ins['up']['kernel'].spec}, down kernel {ins['down']['kernel'].spec}, "
          f"attention {plan.sharding_of('attention').spec}")
    if args.html:
        plan.save_html(args.html)
        print(f"plan written to {args.html}")

    return compare(spmd_step, plain_step, params, opt_state, ((tokens,) for tokens in data))


if __name__ == "__main__":
    sys.exit(0 if main() < 1e-3 else 1)
