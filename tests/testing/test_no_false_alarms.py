"""No false alarms: assert_spmd_equivalent passes on a sample of the repository's reference
programs (the MLP and training step the search tests share, the demo's transformer block, the
conv net and the sort/top_k/cumsum program of programs/test_programs.py), over drawn meshes,
shardings, shapes and special values; gradients and vmap on the MLP."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.demo import transformer_block
from models import mlp, train_step


def f32(*shape, seed=0):
    return gpt.fill(shape, np.float32, seed)


def test_mlp_value_grad_and_vmap():
    gpt.assert_spmd_equivalent(mlp, f32(8, 16), f32(16, 12), f32(12, 4), also_grad=True, also_vmap=True,
                               max_examples=4)


def test_train_step():
    gpt.assert_spmd_equivalent(train_step, f32(16, 12), f32(12, 4), f32(8, 16), f32(8, 4), max_examples=3,
                               value_modes=("plain",))


def test_transformer_block_on_given_meshes():
    b, t, d, h, k, f = 2, 8, 16, 4, 4, 32
    args = (f32(b, t, d), f32(d, h, k), f32(d, h, k), f32(d, h, k), f32(h, k, d), f32(d, f), f32(f, d), f32(d), f32(d))
    meshes = [gp.Mesh((2, 4), ("x", "y")), gp.Mesh((4, 2), ("x", "y"), devices=[7, 6, 5, 4, 3, 2, 1, 0])]
    heads = gp.P(None, "y", None)
    specs = (gp.P("x", None, None), heads, heads, heads, gp.P("y", None, None), gp.P(None, "y"), gp.P("y", None),
             None, None)
    gpt.assert_spmd_equivalent(transformer_block, *args, mesh=meshes, in_shardings=specs, max_examples=2,
                               vary_shapes=(0,), value_modes=("plain",))


def conv_net(w1, w2, x):
    h = lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = lax.reduce_window(jax.nn.relu(h), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = lax.conv_general_dilated(h, w2, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return (h ** 2).mean()


def test_conv_net_gradient():
    grad = jax.grad(conv_net, argnums=(0, 1))
    gpt.assert_spmd_equivalent(grad, f32(3, 3, 3, 8), f32(3, 3, 8, 4), f32(4, 14, 14, 3),
                               in_shardings=(None, None, gp.P("x", "y", None, None)), max_examples=2,
                               vary_shapes=False, value_modes=("plain",))


def sort_topk_cumsum(x):
    vals, ids = lax.top_k(x, 3)
    return jnp.sort(x, axis=0), vals, ids, jnp.cumsum(x, axis=0), jnp.argmax(x, axis=0)


def test_sort_top_k_cumsum_with_special_values():
    gpt.assert_spmd_equivalent(sort_topk_cumsum, f32(13, 6), max_examples=6)


def test_complex_outputs_nan_and_rounding():
    """Complex results compared as their (real, imag) float parts: a NaN equals a NaN and a
    reordered complex sum is within tolerance (they were compared with ==: every NaN of an FFT
    of special values, and any rounding of a sharded complex reduction, was reported)."""
    def fn(x):
        z = lax.complex(x, -x)
        return jnp.fft.fft(x), jnp.sum(z * z * jnp.float32(1.1), axis=1), jnp.cumsum(z, axis=0)

    gpt.assert_spmd_equivalent(fn, f32(8, 16), max_examples=12, seed=0)
