"""Host callbacks: jax.debug.print / jax.debug.callback and jax.pure_callback; and
``lax.dce_sink``, an effect with no result that keeps its operand computed.

    debug_print    x [m,n] ->            "[i,j] ->"       i, j: need_replication; printed once,
                                                          by the first device, with the whole value
    debug_callback x [m,n] ->            (the same)
    pure_callback  x [m,n] -> y [p]      "[i,j] -> [k]"   every factor need_replication: called
                                                          once, by the first device, with whole
                                                          arrays; results broadcast (a replicated
                                                          fallback, reported)

    dce_sink       x [m,n] ->            "[i,j] ->"       pass: each device keeps its shard

jax.jit of a sharded program calls a host callback once with the whole value; so does
gspmd_py (``partitioner/host_calls.py``: a failing pure_callback is a Python exception). (``io_callback`` has ordered side effects whose results every device would need:
no rule.)
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .replicated import whole
from .rule import OpRule, RuleBuilder


@register("debug_print", "debug_callback", handler="host_callback")
def debug_callback(op) -> OpRule:
    return whole(op)


@register("pure_callback", handler="pure_callback")
def pure_callback(op) -> OpRule:
    return whole(op)


@register("dce_sink", handler="generic")
def dce_sink(op) -> OpRule:
    b = RuleBuilder()
    for v in op.inputs:
        b.operand(b.factors(v.shape))
    return b.build()


declare("dce_sink", facts=F.OpFacts(F.ZERO))
declare("debug_print", "debug_callback", "pure_callback", facts=F.OpFacts(F.PER_OUTPUT))
