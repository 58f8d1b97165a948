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

``random_split(key, shape)`` is the same draw: new key e's data is the pair
``threefry2x32(key, (hi, lo) of e's index in shape)`` (``_threefry_split_foldlike``), so a device
with a sharded new dim draws its block of keys from its counters; with only the key array's
own dims sharded each device splits its own keys (no draw of counters needed).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import jax_compat as compat
from .context import Ctx
from .fallback import replicated
from .registry import handler
from .reshard import reshard


def _threefry():
    return compat.threefry2x32_p()  # None on a jax without it: computed whole, reported


def _partitionable(op) -> str:
    """'' if random_bits (random_split) can be drawn per shard, else why not."""
    impl = getattr(getattr(op.inputs[0].dtype, "_impl", None), "name", "")
    if impl != "threefry2x32":
        return f"{op.prim} with the {impl or 'unknown'} key implementation"
    if not jax.config.jax_threefry_partitionable:
        return f"{op.prim} with jax_threefry_partitionable=False"
    if math.prod(op.params["shape"]) >= 2 ** 32:
        return f"{op.prim} of 2**32 elements or more"
    if _threefry() is None:
        return f"{op.prim}: this jax has no threefry2x32 primitive"
    return ""


def _counters(ctx: Ctx, shape, dims, local):
    """(hi, lo): the row-major index in ``shape`` of each element of this device's block
    (``local``, the block of dims sharded as ``dims``), as threefry's two counter words."""
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    lo = jnp.zeros(local, jnp.uint32)
    for d, (n, axes) in enumerate(zip(shape, dims)):
        idx = lax.broadcasted_iota(jnp.uint32, local, d) + ctx.offset(n, axes).astype(jnp.uint32)
        lo = lo + idx * jnp.uint32(strides[d])
    return jnp.zeros_like(lo), lo


def _key_words(key, ndim: int):
    """The keys' two words, each K_local + (1,) * ndim: scalars to threefry, which broadcasts them."""
    data = jax.random.key_data(key.x)  # K_local + (2,)
    bcast = data.shape[:-1] + (1,) * ndim
    return data[..., 0].reshape(bcast), data[..., 1].reshape(bcast)


def _split(ctx: Ctx, op, rule, plan, args):
    key, out, dims = args[0], op.outputs[0], plan.results[0]
    nk = key.rank
    if not any(dims[nk:]):  # only the key array's dims sharded: each device splits its own keys
        return [ctx.pv(op.primitive.bind(key.x, **op.params), out.shape, dims)]
    why = _partitionable(op)
    if why:
        ctx.note(f"{why}: split whole on every device")
        return replicated(ctx, op, rule, plan, [reshard(ctx, a, ((),) * a.rank) for a in args],
                          how=f"{why}: computed replicated")
    shape = tuple(op.params["shape"])
    local = ctx.local_shape(out.shape, dims)[nk:]
    hi, lo = _counters(ctx, shape, dims[nk:], local)
    k1, k2 = _key_words(key, len(shape))
    b1, b2 = _threefry().bind(k1, k2, hi.reshape((1,) * nk + local), lo.reshape((1,) * nk + local))
    new = jax.random.wrap_key_data(jnp.stack([b1, b2], axis=-1), impl=jax.random.key_impl(key.x))
    return [ctx.pv(new, out.shape, dims)]


@handler("random_bits")
def partition_random_bits(ctx: Ctx, op, rule, plan, args):
    if op.prim == "random_split":
        return _split(ctx, op, rule, plan, args)
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
    hi, lo = _counters(ctx, shape, dims[nk:], local)
    k1, k2 = _key_words(key, len(shape))
    b1, b2 = _threefry().bind(k1, k2, hi.reshape((1,) * nk + local), lo.reshape((1,) * nk + local))
    dtype = np.dtype(out.dtype)
    if width == 64:
        bits = (b1.astype(dtype) << jnp.asarray(32, dtype)) | b2.astype(dtype)
    else:
        bits = (b1 ^ b2).astype(dtype)
    return [ctx.pv(bits, out.shape, dims, dtype=out.dtype)]
