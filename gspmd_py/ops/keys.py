"""Typed PRNG key ops over arrays of keys: each key is one problem, so the key array's dims
are batch dims (pass factors) and the trailing dims a key op adds or removes are whole.

    random_wrap    u32[b,2] -> key[b]          "[i,j] -> [i]"     j: need_replication
    random_unwrap  key[b] -> u32[b,2]          "[i] -> [i,j]"     j: need_replication
    random_split   key[b] shape=(3,) -> key[b,3]  "[i] -> [i,j]"  j: result only (any sharding: each
                                                                  device draws its block of new keys)
    random_fold_in key[b], u32[b] (or u32[]) -> key[b]            elementwise over the keys
    random_clone   key[b] -> key[b]

``jax.vmap(lambda k: jax.random.split(k, 3))(keys)`` with the keys sharded splits each
device's own keys: no collective (it gathered the whole key array before). Computed by
partitioner/fallback.py's ``batched`` handler (each device runs the op on its block).

``random_split`` is a draw (JAX's partitionable threefry: new key e is ``threefry2x32(key,
(hi, lo) of e's index in shape)``, random_bits' counters), so its new dims may be sharded as
random_bits' dims are: partitioner/random_handler.py draws each device's block of keys
(``jax.random.split(key, batch)`` for per-row sampling keys over a data-sharded batch).
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .replicated import whole
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder

KEY_OPS = ("random_wrap", "random_unwrap", "random_fold_in", "random_clone")


def _key_shape(op) -> tuple[int, ...]:
    """The shape of the op's key array (the batch dims every tensor of the op starts with)."""
    return tuple(op.outputs[0].shape if op.prim == "random_wrap" else op.inputs[0].shape)


@register(*KEY_OPS, handler="batched")
def key_op(op) -> OpRule:
    batch = _key_shape(op)
    nb = len(batch)
    tensors = (*op.inputs, *op.outputs)
    if not nb or any(tuple(v.shape[:nb]) != batch and v.rank for v in tensors):
        return whole(op)
    b = RuleBuilder()
    fs = b.factors(batch)
    for v in op.inputs:  # a scalar operand (fold_in's message for every key) has no batch dims
        b.operand((fs if v.rank else []) + [b.factor(s, NEED_REPLICATION) for s in v.shape[nb if v.rank else 0:]])
    for v in op.outputs:
        b.result(fs + [b.factor(s, NEED_REPLICATION) for s in v.shape[nb:]])
    return b.build(OTHER)


@register("random_split", handler="random_bits")
def key_split(op) -> OpRule:
    """The key array's dims pass; the new dims (``shape``) are the result's alone, as random_bits'."""
    nb = op.inputs[0].rank
    b = RuleBuilder()
    fs = b.factors(op.outputs[0].shape)
    return b.operand(fs[:nb]).result(fs).build(OTHER)


declare("random_wrap", "random_unwrap", "random_clone", facts=F.OpFacts(F.ELEMENTWISE_FLOPS, fusion=F.FUSIBLE))
declare("random_split", "random_fold_in", facts=F.OpFacts(F.PER_OUTPUT))
