"""A shard_map region's body, run per device inside gspmd_py's own per-device program.

gspmd_py's program already runs inside a shard_map over the (fine) mesh, all axes manual,
``check_vma=False``, so the region's equations run there as written; ``run_body`` replays
them equation by equation, except:

* named-axis collectives (psum, pmax, pmin, all_gather, all_to_all, ppermute, psum_scatter,
  axis_index, ragged_all_to_all, and their ``*_invariant`` forms of varying-axes typing) are
  re-issued through ``jax.lax`` with each user axis name replaced by its fine sub-axes (a
  mesh axis "y" that the plan splits into "y:0", "y:1" is the tuple of both, major first,
  which is how JAX linearises a tuple of axes);
* a collective over size-1 mesh axes only (which the program has no fine axis for) is what it
  computes on one device (an identity, a new or dropped unit dim, ``axis_index`` 0);
* ``pvary`` / ``pcast`` (varying-axes casts of ``check_vma``) are identities: the program
  has no varying-axes types;
* calls (jit, closed_call, custom_jvp/vjp, checkpoint) are inlined and scan / while / cond
  are rebuilt with ``jax.lax`` around their replayed bodies (their jaxprs carry
  varying-axes types the program's values do not have).

Every other equation is bound again with its own parameters.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax.numpy as jnp
from jax import lax
from jax.extend.core import Literal

from ..core import jax_compat as compat
from ..core.errors import UnsupportedOpError

AxisMap = Mapping[str, tuple[str, ...]]
_CASTS = ("pvary", "pcast", "pbroadcast")


def _axes(names, amap: AxisMap) -> tuple[str, ...]:
    names = names if isinstance(names, (tuple, list)) else (names,)
    return tuple(f for n in names for f in amap.get(n, (n,)))


def _one(names, amap: AxisMap):
    axes = _axes(names, amap)
    return axes[0] if len(axes) == 1 else axes


def _single(name: str, p: Mapping[str, Any], xs: list) -> list | None:
    """A collective over mesh axes of size 1 only (no fine axes: the program has none of them):
    what it computes on one device (None: not such a collective)."""
    x = xs[0] if xs else None
    if name in ("psum", "psum_invariant", "pmax", "pmin", "pmax_invariant", "pmin_invariant"):
        return list(xs)
    if name in ("all_gather", "all_gather_invariant"):
        return [x if p["tiled"] else jnp.expand_dims(x, p["all_gather_dimension"])]
    if name == "reduce_scatter":
        return [x if p["tiled"] else jnp.squeeze(x, p["scatter_dimension"])]
    if name == "all_to_all":  # the primitive's shapes are tiled ones (lax.all_to_all adds and drops the unit dims)
        return [x]
    if name == "ppermute":
        return [x if (0, 0) in tuple(map(tuple, p["perm"])) else jnp.zeros_like(x)]
    if name == "axis_index":
        return [jnp.int32(0)]
    return None


def _collective(name: str, p: Mapping[str, Any], xs: list, amap: AxisMap) -> list | None:
    """The equation re-issued through jax.lax over fine axes (None: not a collective)."""
    named = p.get("axes", p.get("axis_name"))
    if named is not None and not _axes(named, amap):
        return _single(name, p, xs)
    g = p.get("axis_index_groups")
    if name in ("psum", "psum_invariant", "pmax", "pmin", "pmax_invariant", "pmin_invariant"):
        fn = {"psum": lax.psum, "pmax": lax.pmax, "pmin": lax.pmin}[name.split("_")[0]]
        axes = _axes(p["axes"], amap)
        return [fn(x, axes, axis_index_groups=g) for x in xs] if g else [fn(x, axes) for x in xs]
    if name in ("all_gather", "all_gather_invariant"):
        return [lax.all_gather(xs[0], _one(p["axis_name"], amap), axis_index_groups=g,
                               axis=p["all_gather_dimension"], tiled=p["tiled"])]
    if name == "reduce_scatter":
        return [lax.psum_scatter(xs[0], _one(p["axis_name"], amap), scatter_dimension=p["scatter_dimension"],
                                 axis_index_groups=g, tiled=p["tiled"])]
    if name == "all_to_all":  # the primitive's shapes are tiled ones whatever its ``tiled``
        return [lax.all_to_all(xs[0], _one(p["axis_name"], amap), p["split_axis"], p["concat_axis"],
                               axis_index_groups=g, tiled=True)]
    if name == "ppermute":
        return [lax.ppermute(xs[0], _one(p["axis_name"], amap), perm=p["perm"])]
    if name == "axis_index":
        return [lax.axis_index(_one(p["axis_name"], amap))]
    if name == "ragged_all_to_all":
        return [lax.ragged_all_to_all(*xs, axis_name=_one(p["axis_name"], amap),
                                      axis_index_groups=p.get("axis_index_groups"))]
    return None


def run_body(jaxpr, consts: Sequence[Any], args: Sequence[Any], amap: AxisMap, where: str = "") -> list:
    """The outputs of ``jaxpr`` (open, with ``consts``) on ``args``, replayed per device."""
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for var, c in zip(jaxpr.constvars, consts):
        env[var] = c
    for var, a in zip(jaxpr.invars, args):
        env[var] = a
    for eqn in jaxpr.eqns:
        xs = [read(v) for v in eqn.invars]
        outs = _eqn(eqn, xs, amap, where)
        for var, o in zip(eqn.outvars, outs):
            env[var] = o
    return [read(v) for v in jaxpr.outvars]


def _closed(j, amap: AxisMap, where: str) -> Callable:
    inner, consts = compat.open_jaxpr(j)
    return lambda *xs: run_body(inner, consts, xs, amap, where)


def _eqn(eqn, xs: list, amap: AxisMap, where: str) -> list:
    name, p = eqn.primitive.name, eqn.params
    if name in _CASTS:
        return xs[:len(eqn.outvars)]
    done = _collective(name, p, xs, amap)
    if done is not None:
        return done
    if name in compat.CALL_PRIMITIVES:
        sub = next((p[k] for k in compat.CALL_PARAMS if p.get(k) is not None), None)
        if sub is not None:
            inner, _ = compat.open_jaxpr(sub)
            n = len(inner.invars)
            return _closed(sub, amap, where)(*(xs[-n:] if len(xs) > n else xs))
    if name == "scan":
        return _scan(p, xs, amap, where)
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cond, body = _closed(p["cond_jaxpr"], amap, where), _closed(p["body_jaxpr"], amap, where)
        cc, bc = xs[:cn], xs[cn:cn + bn]
        return list(lax.while_loop(lambda c: cond(*cc, *c)[0], lambda c: list(body(*bc, *c)), list(xs[cn + bn:])))
    if name == "cond":
        branches = [_closed(b, amap, where) for b in p["branches"]]
        return list(lax.switch(xs[0], [lambda *a, f=f: list(f(*a)) for f in branches], *xs[1:]))
    if name == "shard_map":
        raise UnsupportedOpError(f"a jax.shard_map nested inside the jax.shard_map region at {where or '?'}: "
                                 f"gspmd_py runs one level of manual region")
    params = eqn.primitive.get_bind_params(p)  # (as jax.core.eval_jaxpr binds)
    out = eqn.primitive.bind(*xs, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _scan(p: Mapping[str, Any], xs: list, amap: AxisMap, where: str) -> list:
    nc, ncar = compat.scan_counts(p)
    body = _closed(p["jaxpr"], amap, where)
    consts = xs[:nc]

    def step(carry, x):
        outs = body(*consts, *carry, *x)
        return list(outs[:ncar]), list(outs[ncar:])

    carry, ys = lax.scan(step, list(xs[nc:nc + ncar]), list(xs[nc + ncar:]), length=p["length"],
                         reverse=p["reverse"], unroll=p.get("unroll", 1))
    return list(carry) + list(ys)
