"""The combiner (XLA's AllReduceCombiner, AllGatherCombiner, ReduceScatterCombiner): independent
collectives of one kind over the same axes are issued as one, on a flat buffer.

Works on the per-device program (a jaxpr) after the partitioner traced it. Two
collectives can merge only if neither depends on the other; the merged one runs where the
last of them could, and everything that used an earlier one's result moves after it (a
stable topological order). Groups grow in program order up to ``threshold`` bytes::

    g1 = psum(dW1, x); g2 = psum(dW2, x); g3 = psum(db, x)      (three gradient syncs)
    ->  g1, g2, g3 = psum_combined(dW1, dW2, db, x)               (one all-reduce)

an all-reduce is one equation over all its operands (variadic.py: no copy into a flat
buffer, XLA issues it as one tuple-shaped all-reduce);
all-gather: each device sends its flat concatenation, receives [k, L] and every tensor's
slice is put back with its gather dim outermost-to-tiled; reduce-scatter: each tensor's
scatter dim is split into its k blocks first, so one [k, L] psum_scatter serves all.
Loop and branch bodies are combined recursively. The merged collective runs under the
name scope ``combined<id>,<id>,...`` (the program index reads it).

The combiner reads the program through its index (program_index.py), never by itself: per
equation the index says whether it is a collective and how it is emitted (primitive, fine
axes, dtype, bytes: ``EqnIndex.emitted``), which op caused it (``op_ids``: the merged
scope's name) and which equations of its body it depends on (``deps``). It only re-emits
equations (``EqnIndex.eqn``), in the order it schedules them. Why an index in and a program
out, and the program indexed again (``compiler.plan_jaxpr``) rather than an index patched
here: each merged group is traced alone (new variables, new concatenations and slices
around the merged collective) and spliced into the body in place of its members, the
equations no group touches kept as they are (``_combine_body``), so a patched index would
have to mirror those traces equation by equation, a second reader of the program in
disguise; indexing the result is the one reader run once more, and only when something
merged (where nothing merges, the program and its index are kept as they are). The compiler
and the search's pricer build their programs with this one emitter (partitioner/passes.py).
"""
from __future__ import annotations

import heapq
from typing import Callable, Optional

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from ..ops import facts_of
from ..ops.collectives import FLAT_GATHER, FLAT_SCATTER, NO_MERGE, VARIADIC, kind_of
from . import variadic
from .program_index import Body, EqnIndex, ProgramIndex, equations_of

DEFAULT_THRESHOLD_BYTES = 30 * 2**20  # as XLA's GPU all-reduce combiner


@attrs.define
class Group:
    key: tuple
    members: list[int]  # positions in the body, program order
    bits: int = 0
    nbytes: int = 0
    needs: int = 0  # union of the members' dependency bitsets (what the group depends on)


def collective_key(e: EqnIndex) -> Optional[tuple]:
    """What collectives must share to merge (None: this one does not merge)."""
    c = e.emitted
    if c is None or not facts_of(e.prim).combinable or c.grouped or c.operands != 1 \
            or isinstance(e.eqn.invars[0], Literal):  # (a constant: nothing to merge)
        return None
    merge = kind_of(facts_of(e.prim).collective).merge
    if merge == NO_MERGE or merge in (FLAT_GATHER, FLAT_SCATTER) and not c.tiled:
        return None
    return e.prim, c.axes, c.dtype


def merge_groups(body: Body, threshold: int) -> list[Group]:
    deps: list[int] = []  # per eqn: bitset of candidate eqns it depends on (transitively)
    cand: dict[int, tuple] = {}
    for i, e in enumerate(body.entries):
        d = 0
        for j in e.deps:
            d |= deps[j] | ((1 << j) if j in cand else 0)
        deps.append(d)
        k = collective_key(e)
        if k is not None:
            cand[i] = k
    groups: list[Group] = []
    open_: dict[tuple, Group] = {}

    def feeds(a: Group, b: Group) -> bool:  # does some member of b depend on a member of a?
        return bool(b.needs & a.bits)

    def reached(src: Group) -> set:
        """ids of the groups reachable from ``src`` (itself included)."""
        seen, todo = {id(src)}, [src]
        while todo:
            g = todo.pop()
            for h in groups:
                if id(h) not in seen and feeds(g, h):
                    seen.add(id(h))
                    todo.append(h)
        return seen

    for i, k in cand.items():
        g = open_.get(k)
        n = body.entries[i].emitted.nbytes
        # c may join g if it depends on no member of g and merging makes no cycle between
        # merged collectives (g ->* h -> c, with c now part of g)
        if g is not None and not (deps[i] & g.bits) and g.nbytes + n <= threshold:
            near = [h for h in groups if h is not g and deps[i] & h.bits]
            if not near or not any(id(h) in reach for reach in (reached(g),) for h in near):
                g.members.append(i)
                g.bits |= 1 << i
                g.nbytes += n
                g.needs |= deps[i]
                continue
        g = Group(k, [i], 1 << i, n, deps[i])
        open_[k] = g
        groups.append(g)
    done = groups
    return [g for g in done if len(g.members) > 1]


def _schedule(body: Body, groups: list[Group]) -> list:
    """Nodes (eqn position or Group) in a stable topological order, each group at its last
    member. A node is named by its position (a group's: its last member's)."""
    at: dict[int, int] = {m: g.members[-1] for g in groups for m in g.members}
    group_of = {g.members[-1]: g for g in groups}
    keys = [i for i in range(len(body.entries)) if at.get(i, i) == i]
    preds: dict[int, set] = {k: set() for k in keys}
    succs: dict[int, list] = {k: [] for k in keys}
    for k in keys:
        for i in (group_of[k].members if k in group_of else (k,)):
            for j in body.entries[i].deps:
                p = at.get(j, j)
                if p != k and p not in preds[k]:
                    preds[k].add(p)
                    succs[p].append(k)
    ready = [k for k in keys if not preds[k]]
    heapq.heapify(ready)
    order = []
    while ready:
        k = heapq.heappop(ready)
        order.append(group_of.get(k, k))
        for s in succs[k]:
            preds[s].discard(k)
            if not preds[s]:
                heapq.heappush(ready, s)
    assert len(order) == len(keys), "combiner: dependence cycle"
    return order


def _run_group(body: Body, g: Group, read: Callable):
    eqns = [body.entries[i].eqn for i in g.members]
    xs = [read(e.invars[0]) for e in eqns]
    name, axes, _ = g.key
    merge = kind_of(facts_of(name).collective).merge
    if merge == VARIADIC:  # one equation over every operand, no flat buffer (variadic.py)
        return variadic.all_reduce(name, xs, axes)
    k = int(eqns[0].params["axis_size"])
    if merge == FLAT_GATHER:
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
    # FLAT_SCATTER: split each scatter dim into its k blocks, scatter them all at once
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


def _scope(body: Body, g: Group) -> str:
    """The merged collective's name scope: the ops that caused its members, as the index says."""
    ids: list[int] = []
    for i in g.members:
        e = body.entries[i]
        if e.key.startswith("op") and e.op_ids[0] not in ids:
            ids.append(e.op_ids[0])
    return "combined" + ",".join(map(str, ids)) if ids else "boundary"


def _sub_params(index: ProgramIndex, entry: EqnIndex, groups: dict, axis_env) -> dict:
    """``entry``'s parameters, each ClosedJaxpr body (alone or in a tuple of them) combined."""
    params = dict(entry.eqn.params)
    for b in index.subs(entry):
        v = entry.eqn.params[b.param]
        if isinstance(v, ClosedJaxpr):
            params[b.param] = _combine_body(index, b, groups, axis_env)
        elif isinstance(v, (tuple, list)) and v and all(isinstance(c, ClosedJaxpr) for c in v):
            got = params[b.param]
            got = list(got) if isinstance(got, (tuple, list)) else got
            got[b.position] = _combine_body(index, b, groups, axis_env)
            params[b.param] = _same_kind(v, got)
    return params


def _same_kind(v, items: list):
    """``items`` as a sequence of ``v``'s type: a NamedTuple (custom_linear_solve's
    ``_LinearSolveTuple``) takes its fields positionally, a tuple or list the iterable."""
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):
        return type(v)(*items)
    return type(v)(items)


def combine(index: ProgramIndex, threshold: int = DEFAULT_THRESHOLD_BYTES,
            axis_env: Optional[list] = None) -> ClosedJaxpr:
    """The program ``index`` indexes with independent collectives merged (see the module
    docstring); ``index.program`` itself when nothing merges (threshold 0: never)."""
    groups = {p: g for p, b in index.bodies.items() if threshold > 0 and (g := merge_groups(b, threshold))}
    if not groups:
        return index.program
    return _combine_body(index, index.root, groups, axis_env)


def _combine_body(index: ProgramIndex, body: Body, groups: dict, axis_env) -> ClosedJaxpr:
    """``body.closed`` with its ``groups[body.path]`` merged and its own bodies combined,
    without retracing it: the equations no group touches are kept as they are (in
    ``_schedule``'s order), each group's equations are traced alone (``_run_group`` over its
    members' operands, under its scope) and spliced in, writing the members' own result
    variables; an equation whose bodies are combined keeps its own, with those bodies
    replaced. The compiler and the search's pricer build their programs with it alike."""
    closed = body.closed
    mine = groups.get(body.path, [])
    has_sub = any(b.closed is not None for e in body.entries for b in index.subs(e))
    if not mine and not has_sub:
        return closed
    eqns = []
    for n in _schedule(body, mine):
        if isinstance(n, Group):
            eqns += _group_eqns(body, n, axis_env)
            continue
        entry = body.entries[n]
        if any(b.closed is not None for b in index.subs(entry)):
            eqns.append(entry.eqn.replace(params=_sub_params(index, entry, groups, axis_env)))
        else:
            eqns.append(entry.eqn)
    return ClosedJaxpr(body.jaxpr.replace(eqns=eqns), closed.consts)


def _group_eqns(body: Body, g: Group, axis_env) -> list:
    """The equations of group ``g`` merged, traced alone and renamed onto the body's
    variables (operands in: variables or the body's constants, ``collective_key`` merges no
    literal; the members' results out)."""
    members = [body.entries[i].eqn for i in g.members]
    ins = [e.invars[0] for e in members]
    outs = [e.outvars[0] for e in members]
    uniq = list(dict.fromkeys(ins))
    where = {v: k for k, v in enumerate(uniq)}

    def fn(*xs):
        with jax.named_scope(_scope(body, g)):
            return _run_group(body, g, lambda v: xs[where[v]])

    traced = jax.make_jaxpr(fn, axis_env=axis_env)(*[v.aval for v in uniq])
    j = traced.jaxpr
    rename = dict(zip(j.invars, uniq))
    # each group result is a new variable of the trace (a slice, a reshape or an output of
    # the one merged collective), so renaming it onto its member's result is one to one
    assert not (traced.consts or j.constvars) and len(j.outvars) == len(outs) and \
        len({*j.outvars} - {*rename}) == len(outs), "combiner: a merged group did not trace one to one"
    rename.update(zip(j.outvars, outs))
    new = lambda vs: [v if isinstance(v, Literal) else rename.get(v, v) for v in vs]  # noqa: E731
    return [e.replace(invars=new(e.invars), outvars=new(e.outvars)) for e in equations_of(j)]
