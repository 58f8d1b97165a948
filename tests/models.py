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


def block_grad(x, wq, wk, wv, wo, w1, w2, g1, g2):
    """A transformer block's gradients (gspmd_py.demo's block; weights [d, h, k] used by einsum)."""
    from gspmd_py.demo import transformer_block

    return jax.grad(lambda *a: transformer_block(*a).sum(), argnums=tuple(range(1, 9)))(x, wq, wk, wv, wo, w1, w2,
                                                                                          g1, g2)


def block_shapes(b=4, t=16, d=32, h=4, k=8, f=64):
    return [(b, t, d), (d, h, k), (d, h, k), (d, h, k), (h, k, d), (d, f), (f, d), (d,), (d,)]


def conv_net(x, w1, w2):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    return jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)


def scan_stack(x, w1, w2):
    """A scanned stack of MLP layers: stacked weights [L, d, f], [L, f, d]."""
    def layer(h, w):
        return jax.nn.relu(h @ w[0]) @ w[1], None

    return jax.lax.scan(layer, x, (w1, w2))[0]


def tied_lm(wte, w1, tokens_onehot):
    """Tied embeddings: wte [v, d] embeds (left operand) and projects back as wte.T (right operand)."""
    h = tokens_onehot @ wte
    h = jax.nn.relu(h @ w1)
    return jnp.einsum("btd,vd->btv", h, wte)


def sgd_step(params, x, y):
    """An MLP training step over a parameter dict (weights, then gradients, then updates)."""
    def loss(p):
        return jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"] - y) ** 2)

    g = jax.grad(loss)(params)
    return jax.tree_util.tree_map(lambda w, d: w - 0.1 * d, params, g)


# (name, function, argument shapes, mesh shape, axis names): the reference programs the search's
# replay and determinism tests run on (small: each search takes a fraction of a second)
REFERENCE = (
    ("mlp", mlp, [(32, 64), (64, 128), (128, 64)], (2, 4), ("x", "y")),
    ("train_step", train_step, [(32, 64), (64, 32), (128, 32), (128, 32)], (8,), ("m",)),
    ("block_grad", block_grad, block_shapes(), (2, 4), ("x", "y")),
    ("conv_net", conv_net, [(4, 16, 16, 8), (3, 3, 8, 8), (3, 3, 8, 8)], (2, 4), ("x", "y")),
    ("scan_stack", scan_stack, [(16, 32), (3, 32, 64), (3, 64, 32)], (2, 4), ("x", "y")),
    ("tied_lm", tied_lm, [(64, 32), (32, 32), (4, 8, 64)], (2, 4), ("x", "y")),
)
