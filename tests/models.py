"""Small models the search's tests share (test_auto_shard.py, test_tables.py)."""
import jax
import jax.numpy as jnp


def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def train_step(w1, w2, x, y):
    def loss(w1, w2):
        return jnp.mean((jax.nn.relu(x @ w1) @ w2 - y) ** 2)

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2
