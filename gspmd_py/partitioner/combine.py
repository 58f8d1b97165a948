"""The combiner (XLA's AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner): independent
collectives of one kind over the same axes are issued as one, on a flat buffer.

Works on the per-device program (a jaxpr) after the partitioner traced it. Two
collectives can merge only if neither depends on the other; the merged one runs where the
last of them could, and everything that used an earlier one's result moves after it (a
stable topological order). Groups grow in program order up to ``threshold`` bytes::

    g1 = psum(dW1, x); g2 = psum(dW2, x); g3 = psum(db, x)      (three gradient syncs)
    ->  flat = concat(ravel(dW1), ravel(dW2), ravel(db)); flat = psum(flat, x)
        g1, g2, g3 = reshape(slice(flat, ...)) ...                (one all-reduce)

all-gather: each device sends its flat concatenation, receives [k, L] and every tensor's
slice is put back with its gather dim outermost-to-tiled; reduce-scatter: each tensor's
scatter dim is split into its k blocks first, so one [k, L] psum_scatter serves all.
Loop and branch bodies are combined recursively. The merged collective runs under the
name scope ``combined<id>,<id>,...`` (records.py reads it).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from ..ops import facts_of

DEFAULT_THRESHOLD_BYTES = 30 * 2**20  # as XLA's GPU all-reduce combiner
_OP = re.compile(r"(?:^|/)op(\d+)(?:/|$)")


@attrs.define
class _Group:
    key: tuple
    members: list[int]  # eqn indices, program order
    bits: int = 0
    nbytes: int = 0


def _axes(eqn) -> tuple:
    a = eqn.params.get("axes", eqn.params.get("axis_name"))
    return tuple(a) if isinstance(a, (tuple, list)) else (a,)


def _key(eqn) -> Optional[tuple]:
    name = eqn.primitive.name
    if not facts_of(name).combinable or eqn.params.get("axis_index_groups") is not None or len(eqn.invars) != 1:
        return None
    if name in ("all_gather", "reduce_scatter") and not eqn.params.get("tiled"):
        return None
    return name, _axes(eqn), str(eqn.invars[0].aval.dtype)


def _nbytes(eqn) -> int:
    a = eqn.invars[0].aval
    return int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize


def _groups(jaxpr, threshold: int) -> list[_Group]:
    producer: dict[Any, int] = {}
    deps: list[int] = []  # per eqn: bitset of candidate eqns it depends on (transitively)
    cand: dict[int, tuple] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        d = 0
        for v in eqn.invars:
            j = producer.get(v) if not isinstance(v, Literal) else None
            if j is not None:
                d |= deps[j] | ((1 << j) if j in cand else 0)
        deps.append(d)
        k = _key(eqn)
        if k is not None:
            cand[i] = k
        for v in eqn.outvars:
            producer[v] = i
    groups: list[_Group] = []
    open_: dict[tuple, _Group] = {}

    def feeds(a: _Group, b: _Group) -> bool:  # does some member of b depend on a member of a?
        return any(deps[m] & a.bits for m in b.members)

    def reaches(src: _Group, dst: _Group) -> bool:
        seen, todo = {id(src)}, [src]
        while todo:
            g = todo.pop()
            if g is dst:
                return True
            for h in groups:
                if id(h) not in seen and feeds(g, h):
                    seen.add(id(h))
                    todo.append(h)
        return False

    for i, k in cand.items():
        g = open_.get(k)
        n = _nbytes(jaxpr.eqns[i])
        # c may join g if it depends on no member of g and merging makes no cycle between
        # merged collectives (g ->* h -> c, with c now part of g)
        if g is not None and not (deps[i] & g.bits) and g.nbytes + n <= threshold and not any(
                (deps[i] & h.bits) and reaches(g, h) for h in groups if h is not g):
            g.members.append(i)
            g.bits |= 1 << i
            g.nbytes += n
            continue
        g = _Group(k, [i], 1 << i, n)
        open_[k] = g
        groups.append(g)
    done = groups
    return [g for g in done if len(g.members) > 1]


def _schedule(jaxpr, groups: list[_Group]) -> list:
    """Nodes (eqn index or _Group) in a stable topological order, each group at its last member."""
    import heapq

    node_of: dict[int, Any] = {}
    for g in groups:
        for m in g.members:
            node_of[m] = g
    producer: dict[Any, Any] = {}
    nodes: list = []
    prio: dict[int, int] = {}
    for i, eqn in enumerate(jaxpr.eqns):
        n = node_of.get(i, i)
        if isinstance(n, _Group):
            if i != n.members[-1]:
                for v in eqn.outvars:
                    producer[v] = n
                continue
            prio[id(n)] = i
        else:
            prio[id(n)] = i
        nodes.append(n)
        for v in eqn.outvars:
            producer[v] = n
    preds: dict[int, set] = {id(n): set() for n in nodes}
    succs: dict[int, list] = {id(n): [] for n in nodes}
    for n in nodes:
        idxs = n.members if isinstance(n, _Group) else [n]
        for i in idxs:
            for v in jaxpr.eqns[i].invars:
                p = None if isinstance(v, Literal) else producer.get(v)
                if p is not None and p is not n and id(p) not in preds[id(n)]:
                    preds[id(n)].add(id(p))
                    succs[id(p)].append(n)
    ready = [(prio[id(n)], k, n) for k, n in enumerate(nodes) if not preds[id(n)]]
    heapq.heapify(ready)
    order, seq = [], len(nodes)
    while ready:
        _, _, n = heapq.heappop(ready)
        order.append(n)
        for s in succs[id(n)]:
            preds[id(s)].discard(id(n))
            if not preds[id(s)]:
                seq += 1
                heapq.heappush(ready, (prio[id(s)], seq, s))
    assert len(order) == len(nodes), "combiner: dependence cycle"
    return order


def _run_group(jaxpr, g: _Group, read: Callable):
    eqns = [jaxpr.eqns[i] for i in g.members]
    xs = [read(e.invars[0]) for e in eqns]
    name, axes, _ = g.key
    if name in ("psum", "pmax", "pmin"):
        flat = jnp.concatenate([x.reshape(-1) for x in xs])
        flat = {"psum": lax.psum, "pmax": lax.pmax, "pmin": lax.pmin}[name](flat, axes)
        return _split(flat, [x.shape for x in xs])
    k = int(eqns[0].params["axis_size"])
    if name == "all_gather":
        flat = jnp.concatenate([x.reshape(-1) for x in xs])
        got = lax.all_gather(flat, axes, axis=0, tiled=False)  # [k, L]
        outs, off = [], 0
        for x, e in zip(xs, eqns):
            n = int(np.prod(x.shape, dtype=np.int64))
            d = e.params["all_gather_dimension"]
            piece = got[:, off:off + n].reshape((k,) + x.shape)
            piece = jnp.moveaxis(piece, 0, d)
            outs.append(piece.reshape(x.shape[:d] + (k * x.shape[d],) + x.shape[d + 1:]))
            off += n
        return outs
    # reduce_scatter: split each scatter dim into its k blocks, scatter them all at once
    blocks, shapes = [], []
    for x, e in zip(xs, eqns):
        d = e.params["scatter_dimension"]
        c = x.shape[d] // k
        y = jnp.moveaxis(x.reshape(x.shape[:d] + (k, c) + x.shape[d + 1:]), d, 0)
        shapes.append(y.shape[1:])
        blocks.append(y.reshape(k, -1))
    flat = lax.psum_scatter(jnp.concatenate(blocks, axis=1), axes, scatter_dimension=0, tiled=False)
    return _split(flat, shapes)


def _split(flat, shapes):
    outs, off = [], 0
    for s in shapes:
        n = int(np.prod(s, dtype=np.int64))
        outs.append(flat[off:off + n].reshape(s))
        off += n
    return outs


def _scope(jaxpr, g: _Group) -> str:
    ids = []
    for i in g.members:
        m = _OP.findall(str(jaxpr.eqns[i].source_info.name_stack))
        if m and m[-1] not in ids:
            ids.append(m[-1])
    return "combined" + ",".join(ids) if ids else "boundary"


def _sub_params(params: dict, threshold: int, axis_env) -> dict:
    out = dict(params)
    for k, v in params.items():
        if isinstance(v, ClosedJaxpr):
            out[k] = combine(v, threshold, axis_env)
        elif isinstance(v, (tuple, list)) and v and all(isinstance(b, ClosedJaxpr) for b in v):
            out[k] = type(v)(combine(b, threshold, axis_env) for b in v)
    return out


def _evaluate(jaxpr, consts, args, order, threshold: int, axis_env):
    from jax._src import source_info_util

    env: dict[Any, Any] = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for v, c in zip(jaxpr.constvars, consts):
        env[v] = c
    for v, a in zip(jaxpr.invars, args):
        env[v] = a
    for n in order:
        if isinstance(n, _Group):
            with jax.named_scope(_scope(jaxpr, n)):
                outs = _run_group(jaxpr, n, read)
            for i, o in zip(n.members, outs):
                env[jaxpr.eqns[i].outvars[0]] = o
            continue
        eqn = jaxpr.eqns[n]
        params = _sub_params(eqn.params, threshold, axis_env)
        bind_params = eqn.primitive.get_bind_params(params)
        stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        with source_info_util.user_context(eqn.source_info.traceback, name_stack=stack), eqn.ctx.manager:
            ans = eqn.primitive.bind(*[read(v) for v in eqn.invars], **bind_params)
        ans = ans if eqn.primitive.multiple_results else [ans]
        for v, a in zip(eqn.outvars, ans):
            env[v] = a
    return [read(v) for v in jaxpr.outvars]


def combine(closed: ClosedJaxpr, threshold: int = DEFAULT_THRESHOLD_BYTES,
            axis_env: Optional[list] = None) -> ClosedJaxpr:
    """``closed`` with independent collectives merged (see the module docstring)."""
    jaxpr = closed.jaxpr
    groups = _groups(jaxpr, threshold) if threshold > 0 else []
    has_sub = any(isinstance(v, ClosedJaxpr) or (isinstance(v, (tuple, list)) and v and
                                                 isinstance(v[0], ClosedJaxpr))
                  for e in jaxpr.eqns for v in e.params.values())
    if not groups and not has_sub:
        return closed
    order = _schedule(jaxpr, groups)
    avals = [v.aval for v in jaxpr.invars]

    def fn(*args):
        return _evaluate(jaxpr, closed.consts, args, order, threshold, axis_env)

    return jax.make_jaxpr(fn, axis_env=axis_env)(*avals)
