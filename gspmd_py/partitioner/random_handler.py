"""random_bits partitioned: each device draws just its block, bit-identical to the whole draw.

With JAX's partitionable threefry (``jax_threefry_partitionable``, the default), element e of
``random_bits(key, shape)`` is ``threefry2x32(key, (hi, lo) of e's row-major index in shape)``
(combined per bit width). A device holding rows [o_d, o_d + c_d) of each dim d computes the
indices of its block, ``sum_d (o_d + i_d) * stride_d``, and the same function of them::

    random_bits(key, (8, 12)) over [{x}, {y}] on (2, 4): device (1, 2) draws elements
    [4:8, 6:9], counters 4*12+6 ... 7*12+8

The key's two words enter threefry as scalars (a batch of keys: K_local + (1, ..)), which
it broadcasts, as jax's own draw does: per-element copies of the key were two more
full-size tensors through the hash (3-5x slower per call, even on a 1-device mesh).

Padding rows of uneven dims get counters past the end (their values are never used). Other
key implementations, the original (non-partitionable) threefry, and draws of 2**32 elements
or more are computed whole on every device and reported.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import jax_compat as compat
from .context import Ctx
from .fallback import replicated
from .registry import handler
from .reshard import reshard


def _threefry():
    return compat.threefry2x32_p()  # None on a jax without it: computed whole, reported


def _partitionable(op) -> str:
    """'' if random_bits can be drawn per shard, else why not."""
    impl = getattr(getattr(op.inputs[0].dtype, "_impl", None), "name", "")
    if impl != "threefry2x32":
        return f"random_bits with the {impl or 'unknown'} key implementation"
    if not jax.config.jax_threefry_partitionable:
        return "random_bits with jax_threefry_partitionable=False"
    if math.prod(op.params["shape"]) >= 2 ** 32:
        return "random_bits of 2**32 elements or more"
    if _threefry() is None:
        return "random_bits: this jax has no threefry2x32 primitive"
    return ""


@handler("random_bits")
def partition_random_bits(ctx: Ctx, op, rule, plan, args):
    why = _partitionable(op)
    if why:
        ctx.note(f"{why}: drawn whole on every device")
        # from the whole keys: a device's own keys would draw only its rows (as a replicated block)
        return replicated(ctx, op, rule, plan, [reshard(ctx, a, ((),) * a.rank) for a in args],
                          how=f"{why}: computed replicated")
    key = args[0]
    shape, width = tuple(op.params["shape"]), op.params["bit_width"]
    out = op.outputs[0]
    nk = key.rank
    dims = plan.results[0]
    local = ctx.local_shape(out.shape, dims)[nk:]
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    lo = jnp.zeros(local, jnp.uint32)
    for d, (n, axes) in enumerate(zip(shape, dims[nk:])):
        idx = lax.broadcasted_iota(jnp.uint32, local, d) + ctx.offset(n, axes).astype(jnp.uint32)
        lo = lo + idx * jnp.uint32(strides[d])
    data = jax.random.key_data(key.x)  # K_local + (2,)
    bcast = data.shape[:-1] + (1,) * len(shape)
    k1, k2 = data[..., 0].reshape(bcast), data[..., 1].reshape(bcast)
    lo = lo.reshape((1,) * nk + local)
    hi = jnp.zeros_like(lo)
    b1, b2 = _threefry().bind(k1, k2, hi, lo)
    dtype = np.dtype(out.dtype)
    if width == 64:
        bits = (b1.astype(dtype) << jnp.asarray(32, dtype)) | b2.astype(dtype)
    else:
        bits = (b1 ^ b2).astype(dtype)
    return [ctx.pv(bits, out.shape, dims, dtype=out.dtype)]
