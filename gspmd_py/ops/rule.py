"""Sharding rules as factor mappings (Shardy's OpShardingRule): the one contract between
propagation, the partitioner and the cost model.

An op's rule names a *factor* for every way the op relates tensor dims: each operand
and result dim maps to a list of factors (major first; reshape may need several, a
size-1 dim none). Worked examples in the notation ``OpRule.__str__`` prints and the tests
use (factors are lettered i, j, k, ...)::

    dot_general  [b,m,k] x [b,k,n] -> [b,m,n]   "[i,j,k], [i,k,l] -> [i,j,l]"  k: reduction(sum)
    reduce_max   [m,n] axes=(1,)    -> [m]      "[i,j] -> [i]"                 j: reduction(max)
    reshape      [8] -> [2,4]                   "[(i j)] -> [i,j]"
    cumsum       [m,n] axis=0       -> [m,n]    "[i,j] -> [i,j]"               i: prefix
    sort         [m,n] dimension=1  -> [m,n]    "[i,j] -> [i,j]"               j: need_replication
    conv (forward form)  [b,h,c] x [w,c,o] -> [b,h',o]   h~h': window, w: need_replication,
                                                          c: reduction(sum)
    conv (kernel form: weight gradient, output smaller than the kernel)
                         [b,h,c] x [w,c,o] -> [b,h',o]   h~w: reduction(sum) (each device
                                                          meets the kernel rows it holds),
                                                          h': need_replication

Factor kinds (what a sharded factor means, for every pass that reads the rule):
  pass              same index in every tensor that has it: local computation, no communication
  window            pass, but the op reads neighbouring rows (conv spatial, pad, slice,
                    concatenate, reduce_window): the partitioner exchanges halos. An
                    operand held whole on a window dim is read whole (sliced locally);
                    a reduction factor may be windowed too (``Factor.window``: the conv
                    kernel form), with the same rule for its operands.
  reduction         in operands only: a sharded one leaves the results *partial* over its
                    axes, to be combined with the factor's ``reduce`` op (sum, max, min,
                    and, or, xor, prod; "pick" = exactly one device holds each element,
                    the others the identity: a dynamic slice of sharded rows)
  prefix            a scanned dim (cumsum, cummax): sharded, each device scans its rows and
                    adds the carried prefix of the shards before it
  need_replication  must be unsharded for the op (sort axis, a gather's dims indexed by windows
                    wider than one row); a
                    ``carried`` one (``Factor.carried``: the sort axis) still carries its
                    tensors' sharding from operand to result in propagation (as XLA keeps
                    a sort's sharding), while the recorded projection gives it no axes: they
                    move to another dim of the op for the local computation (projection.py)

Propagation moves shardings between tensors through factors; at its end it records, for
every op, the factor -> axes assignment (the *projection*, propagation/projection.py).
The partitioner executes exactly that projection, and the cost model prices it.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import attrs

PASS, WINDOW, REDUCTION, PREFIX, NEED_REPLICATION = "pass", "window", "reduction", "prefix", "need_replication"
KINDS = (PASS, WINDOW, REDUCTION, PREFIX, NEED_REPLICATION)
SHARDABLE = (PASS, WINDOW, REDUCTION, PREFIX)  # kinds propagation may give axes
REDUCE_OPS = ("sum", "max", "min", "and", "or", "xor", "prod", "pick", "argmax", "argmin")

# op priority levels for propagation (lower runs first), as GSPMD's aggressiveness/Shardy's op priority
ELEMENTWISE, DOT, OTHER, BROADCAST = 0, 1, 2, 3

# Every partitioner handler, by name. A rule names one of these; partitioner/registry.py
# checks at import that each has exactly one handler.
HANDLER_NAMES = frozenset({
    "elementwise", "transpose", "broadcast", "reshape", "iota", "generic", "dot", "reduce", "argreduce",
    "cumulative", "along_dim", "conv", "reduce_window", "select_and_scatter_add", "pad", "slice", "rev",
    "concatenate", "dynamic_slice", "dynamic_update_slice", "split", "control", "replicated", "random_bits",
    "stack", "host_callback", "pure_callback", "scatter", "rotate", "ragged_dot", "batched", "gather", "manual",
})

TensorDims = tuple[tuple[int, ...], ...]  # per dim: factor ids, major first


@attrs.frozen(cache_hash=True)
class Factor:
    size: int
    kind: str = PASS
    reduce: str = ""  # for REDUCTION factors: how partial results combine
    window: bool = False  # the op reads this factor's rows through a window (halo exchange)
    carried: bool = False  # need_replication, but propagation carries its sharding between the tensors

    def __attrs_post_init__(self) -> None:
        if self.kind == WINDOW:
            object.__setattr__(self, "window", True)
        if self.kind not in KINDS:
            raise ValueError(f"unknown factor kind {self.kind!r}")
        if (self.kind == REDUCTION) != bool(self.reduce) or (self.reduce and self.reduce not in REDUCE_OPS):
            raise ValueError(f"factor kind {self.kind!r} with reduce {self.reduce!r}")
        if self.carried and self.kind != NEED_REPLICATION:
            raise ValueError(f"factor kind {self.kind!r} cannot be carried (only need_replication)")


@attrs.frozen(cache_hash=True)
class OpRule:
    factors: tuple[Factor, ...]
    operands: tuple[TensorDims, ...]
    results: tuple[TensorDims, ...]
    level: int = ELEMENTWISE
    forward_level: int | None = None  # level at which operand->result propagation opens (broadcast)
    handler: str = "generic"
    # per factor, its data-flow edge (Shardy's): tensors of different edges share no factor and
    # are computed independently (a loop's carries, constants, xs/ys slots), so a mesh axis may
    # shard one factor per edge. None: the whole op is one edge (an axis shards one factor).
    edges: tuple[int, ...] | None = None

    def edge(self, f: int) -> int:
        return 0 if self.edges is None else self.edges[f]

    @property
    def tensors(self) -> tuple[TensorDims, ...]:
        return self.operands + self.results

    def factor_dims(self, f: int) -> list[tuple[int, int]]:
        """(tensor index, dim) pairs that carry factor f."""
        return [(t, d) for t, dims in enumerate(self.tensors) for d, fs in enumerate(dims) if f in fs]

    def kind(self, f: int) -> str:
        return self.factors[f].kind

    def of_kind(self, *kinds: str) -> list[int]:
        return [f for f, fac in enumerate(self.factors) if fac.kind in kinds]

    def windowed(self, operand: int, dim: int) -> bool:
        """Does the op read operand dim ``dim`` through a window (so it may be held whole)?"""
        fs = self.operands[operand][dim]
        return bool(fs) and self.factors[fs[0]].window

    def __str__(self) -> str:
        names = [chr(ord("i") + i) if i < 18 else f"f{i}" for i in range(len(self.factors))]

        def fmt(dims: TensorDims) -> str:
            return "[" + ",".join("(" + " ".join(names[f] for f in fs) + ")" if len(fs) > 1 else
                                  (names[fs[0]] if fs else "1") for fs in dims) + "]"

        kinds = ", ".join(f"{names[i]}: {f.kind}" + (f"({f.reduce})" if f.reduce else "")
                          for i, f in enumerate(self.factors) if f.kind != PASS)
        text = ", ".join(fmt(t) for t in self.operands) + " -> " + ", ".join(fmt(t) for t in self.results)
        return text + (f"   ({kinds})" if kinds else "")


class RuleBuilder:
    """Fluent construction::

        b = RuleBuilder()
        m, n = b.factors([8, 16])
        k = b.factor(32, REDUCTION, reduce="sum")
        rule = b.operand([m, k]).operand([k, n]).result([m, n]).build(DOT)   # "[i,k], [k,j] -> [i,j]"
    """

    def __init__(self) -> None:
        self._factors: list[Factor] = []
        self._operands: list[TensorDims] = []
        self._results: list[TensorDims] = []

    def factor(self, size: int, kind: str = PASS, reduce: str = "", window: bool = False, carried: bool = False) -> int:
        if kind == REDUCTION and not reduce:
            reduce = "sum"
        self._factors.append(Factor(int(size), kind, reduce, window, carried))
        return len(self._factors) - 1

    def factors(self, sizes: Iterable[int], kind: str = PASS) -> list[int]:
        return [self.factor(s, kind) for s in sizes]

    def operand(self, dims: Sequence[Sequence[int] | int | None]) -> "RuleBuilder":
        self._operands.append(_dims(dims, self._factors))
        return self

    def result(self, dims: Sequence[Sequence[int] | int | None]) -> "RuleBuilder":
        self._results.append(_dims(dims, self._factors))
        return self

    def build(self, level: int = ELEMENTWISE, forward_level: int | None = None, *, edges: bool = False) -> OpRule:
        """``edges=True``: the op's tensors fall into independent data-flow edges (the connected
        components of "shares a factor"), each of which may use every mesh axis once."""
        tensors = tuple(self._operands) + tuple(self._results)
        return OpRule(tuple(self._factors), tuple(self._operands), tuple(self._results), level, forward_level,
                      edges=_components(len(self._factors), tensors) if edges else None)


def whole(op, kind: str = OTHER) -> OpRule:
    """Every operand and result dim one need_replication factor: the op sees whole values."""
    b = RuleBuilder()
    for v in op.inputs:
        b.operand([b.factor(s, NEED_REPLICATION) for s in v.shape])
    for v in op.outputs:
        b.result([b.factor(s, NEED_REPLICATION) for s in v.shape])
    return b.build(kind)


def _components(n: int, tensors: Sequence[TensorDims]) -> tuple[int, ...]:
    """Per factor, the smallest factor id of its component (factors joined by sharing a tensor)."""
    parent = list(range(n))

    def root(f: int) -> int:
        while parent[f] != f:
            parent[f] = parent[parent[f]]
            f = parent[f]
        return f

    for dims in tensors:
        fs = [f for d in dims for f in d]
        for f in fs[1:]:
            a, b = root(fs[0]), root(f)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return tuple(root(f) for f in range(n))


def _dims(dims, factors: list[Factor]) -> TensorDims:
    out = []
    for d in dims:
        fs = () if d is None else (d,) if isinstance(d, int) else tuple(d)
        out.append(tuple(f for f in fs if factors[f].size != 1 or len(fs) == 1))
    return tuple(out)
