"""Evaluate a small piece of the per-device program for every device at once, with NumPy.

The static plan check (plan_check.py) asks two questions whose answer depends on the device:
which devices keep a replicated term when it joins a partial sum (``where(index == 0, x, 0)``:
exactly one per group, else the term is counted on several devices), and which local rows an
uneven dim's mask keeps (exactly the real rows, else padding leaks into a reduction). Both
are computed by the program from ``axis_index``, ``iota``, literals and the plan's constant
tables only; ``evaluate`` runs that cone of equations over a grid of device positions (one
NumPy dimension per mesh axis involved, so a 65,536-device mesh is one vectorised pass).

``None`` means the value is not such a function (it reads data, or an equation this
evaluator does not know): the caller then proves nothing from it.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from jax.extend.core import Literal

_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
}
_UNARY = {"neg": np.negative, "not": np.logical_not, "abs": np.abs, "sign": np.sign}
_SHAPE_ONLY = ("squeeze", "reshape", "expand_dims", "convert_element_type", "copy", "copy_p")


class DeviceGrid:
    """Device positions over ``axes`` (fine mesh axes, mesh order): one NumPy dim per axis."""

    def __init__(self, axes: Sequence[str], sizes: Mapping[str, int]):
        self.axes = tuple(axes)
        self.sizes = tuple(int(sizes[a]) for a in self.axes)

    def index(self, names: Sequence[str]) -> np.ndarray:
        """``axis_index(names)``: the linear position over ``names``, major first, on the grid."""
        out = np.zeros([1] * len(self.axes), np.int64)
        for a in names:
            k = self.axes.index(a)
            shape = [1] * len(self.axes)
            shape[k] = self.sizes[k]
            out = out * self.sizes[k] + np.arange(self.sizes[k]).reshape(shape)
        return out


def _as_bool_or_int(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) if x.dtype.kind in "iu" else x


def evaluate(var, producers: Mapping, consts: Mapping, grid: DeviceGrid, budget: int = 256,
             alias: Mapping = ()) -> Optional[np.ndarray]:
    """``var``'s value on every device of ``grid``: an array of shape grid + the var's shape
    (device dims first), or None (see the module doc). ``producers``: var -> its equation;
    ``consts``: constvar -> its value; ``alias``: a call body's invar -> the caller's operand."""
    memo: dict = {}
    n = len(grid.axes)
    alias = dict(alias)

    def go(v, depth: int):
        while not isinstance(v, Literal) and v in alias:
            v = alias[v]
        if isinstance(v, Literal):
            return np.asarray(v.val).reshape((1,) * n + np.shape(v.val))
        if v in memo:
            return memo[v]
        if v in consts:
            c = np.asarray(consts[v])
            out = c.reshape((1,) * n + c.shape)
        else:
            eqn = producers.get(v)
            if eqn is None or depth > budget:
                return None
            out = _apply(eqn, [go(u, depth + 1) for u in eqn.invars], grid, n)
        memo[v] = out
        return out

    return go(var, 0)


def _apply(eqn, args: list, grid: DeviceGrid, n: int) -> Optional[np.ndarray]:
    name = eqn.primitive.name
    shape = tuple(eqn.outvars[0].aval.shape)
    if name == "axis_index":
        a = eqn.params["axis_name"]
        names = tuple(a) if isinstance(a, (tuple, list)) else (a,)
        if any(x not in grid.axes for x in names):
            return None
        return grid.index(names)
    if name == "iota":
        d = eqn.params["dimension"]
        r = np.arange(shape[d]).reshape([shape[d] if i == d else 1 for i in range(len(shape))])
        return np.broadcast_to(r, shape).reshape((1,) * n + shape)
    if any(a is None for a in args):
        return None
    if name in _BINARY:
        return _BINARY[name](_as_bool_or_int(args[0]), _as_bool_or_int(args[1]))
    if name in _UNARY:
        return _UNARY[name](_as_bool_or_int(args[0]))
    if name in ("div", "rem"):
        a, b = _as_bool_or_int(args[0]), _as_bool_or_int(args[1])
        if np.any(b == 0):
            return None
        q = np.trunc(a / b).astype(np.int64) if a.dtype.kind in "iu" else a / b
        return q if name == "div" else a - q * b
    if name == "select_n":
        pred, cases = args[0], args[1:]
        idx = pred.astype(np.int64)
        out = cases[0]
        for k, c in enumerate(cases[1:], 1):
            out = np.where(idx == k, c, out)
        return out
    if name in _SHAPE_ONLY:
        x = args[0]
        return x.reshape(x.shape[:n] + shape) if x[(0,) * n].size == int(np.prod(shape, dtype=np.int64)) else None
    if name == "broadcast_in_dim":
        x = args[0]
        bd = eqn.params["broadcast_dimensions"]
        src = x.shape[n:]
        mid = [1] * len(shape)
        for k, d in enumerate(bd):
            mid[d] = src[k]
        x = x.reshape(x.shape[:n] + tuple(mid))
        return np.broadcast_to(x, x.shape[:n] + shape)
    if name == "dynamic_slice" and len(args) >= 2:
        table = args[0]
        if table.shape[n:] and all(s == 1 for s in table.shape[:n]) and len(shape) == 1 and len(args) == 2:
            t = table.reshape(table.shape[n:])
            i = np.clip(args[1], 0, t.shape[0] - shape[0])
            return np.stack([t[i + j] for j in range(shape[0])], axis=-1)
        return None
    return None
