"""A while loop with a batched predicate (``jax.vmap`` of a ``lax.while_loop`` whose
condition depends on the mapped values) as one with a scalar predicate.

JAX keeps such a loop as one ``while`` whose cond returns ``bool[b...]``; its lowering runs
while ANY element's predicate holds and, in the body, keeps the carries of the finished
elements (``select(pred, body(carry), carry)``, the predicate broadcast along each carry's
leading dims). The tracer rewrites the loop into exactly that before it becomes a region op,
so the partitioner's loop handler and propagation see ordinary ops (a ``reduce_or`` of a
possibly sharded predicate, a select in the body)::

    while[cond: c -> bool[8]] c                   while[cond: c -> any(p(c))] c
                                            =>      body: c -> select(p(c), body(c), c)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..core import jax_compat as compat


def is_batched(params: dict) -> bool:
    """Does this ``while``'s cond return a predicate with dims?"""
    return bool(params["cond_jaxpr"].out_avals[0].shape)


def _aval(a):
    return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))


def scalar_predicate(params: dict, ins: list) -> tuple[dict, list]:
    """The params and operands of the equivalent while with a scalar predicate: its body
    takes the cond's consts too (before its own) to evaluate the predicate per element."""
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    cn, bn = params["cond_nconsts"], params["body_nconsts"]

    def any_cond(*args):
        (p,) = compat.eval_closed(cond, *args)
        return jnp.any(p)

    def select_body(*args):
        cconsts, bconsts, carry = args[:cn], args[cn:cn + bn], args[cn + bn:]
        (p,) = compat.eval_closed(cond, *cconsts, *carry)
        new = compat.eval_closed(body, *bconsts, *carry)
        return [lax.select(lax.broadcast_in_dim(p, jnp.shape(n), tuple(range(p.ndim))), n, c)
                for n, c in zip(new, carry)]

    c_avals = [_aval(a) for a in cond.in_avals]
    b_avals = [_aval(a) for a in body.in_avals]
    new = dict(params, cond_jaxpr=jax.make_jaxpr(any_cond)(*c_avals),
               body_jaxpr=jax.make_jaxpr(select_body)(*c_avals[:cn], *b_avals), body_nconsts=cn + bn)
    return new, list(ins[:cn]) + list(ins[:cn + bn]) + list(ins[cn + bn:])
