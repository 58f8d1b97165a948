"""Padding of uneven dims through the per-device program: neutral wherever a reduction reads it.

A dim of global size n tiled k ways is held as k shards of ceil(n/k) rows; the rows past n
(on the last shards) are padding. The walk follows, per value and local dim, what the padding
rows hold: a known constant (the boundary pads inputs with zeros; an elementwise op of known
constants is computed; a mask ``where(valid, x, fill)`` puts ``fill`` there, and
device_eval.py checks the mask keeps exactly the real rows) or unknown (``DIRTY``). Where the
records say a value leaves an op padded (``Diagnostics.held``) and the walk has lost track,
its padding is unknown too, so only what the program provably holds is relied on.

A reduction (reduce_sum, max, min, prod, and, or, argmax/argmin), a contraction (dot_general)
or a reverse cumulative op (its padding rows come first) over a padded dim must read the
reduction's identity there (sum 0, max -inf, min +inf, prod 1; a contraction: one side 0);
a forward cumulative op's padding only reaches padding rows. Anything else is a
``non-neutral-pad`` finding naming the op, the value and the mesh axes of the dim.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from jax.extend.core import Literal

from ..ops import facts as F
from ..ops import facts_of
from .device_eval import DeviceGrid, evaluate

DIRTY = "dirty"
_REDUCE = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod",
           "reduce_and": "and", "reduce_or": "or", "argmax": "max", "argmin": "min"}
_CUMULATIVE = {"cumsum": "sum", "cumprod": "prod", "cummax": "max", "cummin": "min", "cumlogsumexp": "max"}
_MAP_SAME = ("convert_element_type", "copy", "copy_p", "gspmd_annotate", "reduce_precision")


class Pad:
    """One padded local dim: its mesh axes, global size, local size and what its padding holds."""

    __slots__ = ("axes", "n", "c", "content")

    def __init__(self, axes: tuple, n: int, c: int, content):
        self.axes, self.n, self.c, self.content = axes, n, c, content

    def moved(self, content) -> "Pad":
        return Pad(self.axes, self.n, self.c, content)


def identity(op: str, dtype) -> object:
    dt = np.dtype(dtype)
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if op in ("and", "or"):
        return op == "and"
    big = np.inf if dt.kind in "fc" else (np.iinfo(dt).max if dt.kind in "iu" else True)
    lo = -np.inf if dt.kind in "fc" else (np.iinfo(dt).min if dt.kind in "iu" else False)
    return lo if op == "max" else big


class PadWalk:
    def __init__(self, plan, report: Callable):
        self.plan = plan
        self.index = plan.index
        self.fine = plan.fine
        self.sizes = plan.fine.size_of
        self.held = plan.diagnostics.held
        self.ops = {op.id: op for op in plan.graph.walk()}
        self.report = report

    def run(self) -> None:
        root = self.index.root
        env: dict = {}
        for k, v in enumerate(root.jaxpr.invars):
            if k < len(self.plan.in_dims) and k < len(self.plan.graph.inputs):
                pads = self._pads(self.plan.graph.inputs[k].shape, self.plan.in_dims[k], tuple(v.aval.shape), 0)
                if pads:
                    env[v] = pads
        c = root.closed
        consts = {} if c is None else dict(zip(c.jaxpr.constvars, c.consts))
        self._body(root, env, consts)

    def _pads(self, shape, dims, local, content) -> dict:
        out = {}
        for d, axes in enumerate(dims):
            k = int(np.prod([self.sizes[a] for a in axes] or [1]))
            if k > 1 and d < len(shape) and shape[d] % k and d < len(local):
                out[d] = Pad(tuple(axes), int(shape[d]), int(local[d]), content)
        return out

    def _body(self, body, env: dict, consts: dict) -> None:
        producers: dict = {}
        where: dict = {}
        for entry in body.entries:
            eqn = entry.eqn
            ins = []
            for v in eqn.invars:
                if isinstance(v, Literal):
                    ins.append({})
                    continue
                k = where.get(v)
                if k is not None and k != entry.key and k.startswith("op") and v not in env:
                    got = self._held_pads(v, k)
                    if got:
                        env[v] = got
                ins.append(env.get(v, {}))
            for b in self.index.subs(entry):  # loop and call bodies: their own values, from scratch
                bc = {} if b.closed is None else dict(zip(b.closed.jaxpr.constvars, b.closed.consts))
                self._body(b, {}, bc)
            if any(ins):
                outs = self._eqn(entry, eqn, ins, producers, consts)
                for v, p in zip(eqn.outvars, outs):
                    if p:
                        env[v] = p
            for v in eqn.outvars:
                producers[v] = eqn
                where[v] = entry.key

    def _held_pads(self, var, key: str) -> dict:
        op = self.ops.get(int(key[2:])) if key[2:].isdigit() else None
        if op is None:
            return {}
        shape = tuple(var.aval.shape)
        for v in op.outputs:
            h = self.held.get(v.id)
            if h is not None and h.local_shape == shape:
                return self._pads(v.shape, h.dims, shape, DIRTY)
        return {}

    # -- one equation ----------------------------------------------------------------
    def _eqn(self, entry, eqn, ins: list, producers, consts) -> list:
        name = eqn.primitive.name
        out_rank = len(eqn.outvars[0].aval.shape) if eqn.outvars else 0
        if name in _REDUCE:
            axes = eqn.params.get("axes", (eqn.params.get("axis"),))
            self._reads(entry, eqn, ins[0], axes, _REDUCE[name], eqn.invars[0])
            kept = [d for d in range(len(eqn.invars[0].aval.shape)) if d not in axes]
            return [{kept.index(d): p for d, p in ins[0].items() if d in kept}] if name.startswith("reduce") else [{}]
        if name in _CUMULATIVE:
            d = eqn.params["axis"]
            if eqn.params.get("reverse") and d in ins[0]:
                self._reads(entry, eqn, ins[0], (d,), _CUMULATIVE[name], eqn.invars[0])
            return [{x: (p if x != d else p.moved(DIRTY)) for x, p in ins[0].items()}]
        if name == "dot_general":
            (lc, rc), _ = eqn.params["dimension_numbers"]
            for dl, dr in zip(lc, rc):
                pl, pr = ins[0].get(dl), ins[1].get(dr)
                if pl is None and pr is None:
                    continue
                a, b = (pl.content if pl else DIRTY), (pr.content if pr else DIRTY)
                if not (_is(a, 0) and _finite(b)) and not (_is(b, 0) and _finite(a)):
                    p = pl or pr
                    self._say(entry, eqn.invars[0 if pl else 1], p, f"dot_general contracts a padded dim whose "
                              f"padding holds {_show(a)} x {_show(b)}, not 0")
            return [{}]
        if name == "select_n":
            return [self._select(entry, eqn, ins, producers, consts)]
        if name in _MAP_SAME or facts_of(name).flops == F.ELEMENTWISE_FLOPS:
            return [self._elementwise(eqn, ins, out_rank)]
        if name == "transpose":
            perm = eqn.params["permutation"]
            return [{k: ins[0][d] for k, d in enumerate(perm) if d in ins[0]}]
        if name == "broadcast_in_dim":
            bd = eqn.params["broadcast_dimensions"]
            src = eqn.invars[0].aval.shape
            return [{bd[d]: p for d, p in ins[0].items() if src[d] == eqn.outvars[0].aval.shape[bd[d]]}]
        return [{} for _ in eqn.outvars]

    def _reads(self, entry, eqn, pads: dict, axes, op: str, var) -> None:
        want = identity(op, var.aval.dtype)
        for d in axes:
            p = pads.get(d)
            if p is not None and not _is(p.content, want):
                self._say(entry, var, p, f"{eqn.primitive.name} reduces a padded dim whose padding holds "
                          f"{_show(p.content)}, not the {op} identity {_show(want)}")

    def _say(self, entry, var, p: Pad, detail: str) -> None:
        self.report(entry, f"{entry.prim} @{'.'.join(map(str, entry.path))}", ",".join(p.axes),
                    f"{detail} (global size {p.n}, {p.c} rows per shard)")

    def _elementwise(self, eqn, ins: list, rank: int) -> dict:
        dims = {d for p in ins for d in p}
        out = {}
        for d in dims:
            ref = next(p[d] for p in ins if d in p)
            vals = []
            for v, p in zip(eqn.invars, ins):
                if d in p:
                    vals.append(p[d].content)
                elif isinstance(v, Literal):
                    vals.append(v.val)
                else:
                    vals.append(DIRTY)
            out[d] = ref.moved(_apply(eqn, vals))
        return out

    def _select(self, entry, eqn, ins: list, producers, consts) -> dict:
        cases = ins[1:]
        dims = {d for p in cases for d in p} | set(ins[0])
        out = {}
        for d in dims:
            ref = next(p[d] for p in ins if d in p)
            contents = [p[d].content if d in p else _literal(v) for v, p in zip(eqn.invars[1:], cases)]
            picked = self._picked(eqn, d, ref, producers, consts)
            if picked is None:
                content = contents[0] if all(_same(c, contents[0]) for c in contents) else DIRTY
            else:
                pad_case, real_case = picked
                if real_case is not None and real_case == pad_case:
                    self._say(entry, eqn.invars[0], ref, "a mask that keeps the padding rows as it keeps the real "
                              "ones")
                content = contents[pad_case]
            out[d] = ref.moved(content)
        return out

    def _picked(self, eqn, d: int, p: Pad, producers, consts) -> Optional[tuple]:
        """The case a mask picks in the padding rows of dim d, and in the real rows (None where
        they differ); None when the predicate is not a function of the device position."""
        order = [a for a in self.fine.names if a in p.axes]
        grid = DeviceGrid(order, self.sizes)
        if int(np.prod(grid.sizes, dtype=np.int64)) * p.c > 1 << 22:
            return None
        val = evaluate(eqn.invars[0], producers, consts, grid)
        if val is None:
            return None
        n = len(order)
        val = np.broadcast_to(val, val.shape[:n] + tuple(eqn.outvars[0].aval.shape)) if val.ndim > n else val
        if val.ndim <= n + d:
            return None
        val = np.moveaxis(val.astype(np.int64), n + d, n).reshape(val.shape[:n] + (p.c, -1))
        rows = DeviceGrid(order, self.sizes).index(p.axes) * p.c  # device order over the dim's axes
        glob = rows[..., None] + np.arange(p.c)  # grid + (c,)
        pad = glob >= p.n
        full = np.broadcast_to(val, np.broadcast_shapes(val.shape, pad.shape + (1,)))
        pad = np.broadcast_to(pad[..., None], full.shape)
        at_pad, at_real = np.unique(full[pad]), np.unique(full[~pad])
        if len(at_pad) != 1:
            return None
        return int(at_pad[0]), (int(at_real[0]) if len(at_real) == 1 else None)


def _literal(v):
    return v.val if isinstance(v, Literal) else DIRTY


def _apply(eqn, vals: list):
    if any(isinstance(x, str) for x in vals):
        return DIRTY
    try:
        args = [np.asarray(x, dtype=v.aval.dtype) for x, v in zip(vals, eqn.invars)]
        out = eqn.primitive.bind(*args, **eqn.params)
        out = np.asarray(out[0] if isinstance(out, (list, tuple)) else out)
        return out.reshape(-1)[0].item() if out.size else DIRTY
    except Exception:  # noqa: BLE001 - a primitive that takes no scalars: its padding is unknown
        return DIRTY


def _is(content, want) -> bool:
    if isinstance(content, str):
        return False
    try:
        return bool(np.asarray(content) == want) or (bool(np.isnan(want)) and bool(np.isnan(content)))
    except TypeError:
        return False


def _same(a, b) -> bool:
    return (isinstance(a, str) and isinstance(b, str)) or (not isinstance(a, str) and not isinstance(b, str)
                                                           and _is(a, b))


def _finite(c) -> bool:
    return not isinstance(c, str) and bool(np.all(np.isfinite(np.asarray(c, dtype=np.float64))))


def _show(c) -> str:
    return "unknown values" if isinstance(c, str) else repr(c)
