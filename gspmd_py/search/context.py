"""What tactics work on: one traced graph, its inputs by argument, and the decisions so far.

A tactic (gspmd_py/search/tactics.py) reads a ``TacticContext`` and adds decisions: "dim d of
value v is sharded over mesh axis a". Decisions accumulate in order; each value's
decisions become one ``Seed`` (its decided dims closed, the others open to propagation)
whose origin names the tactics that decided it, so ``plan.explain`` says which tactic
decided a value. Values the user fixed (in_shardings, gp.annotate) are never touched.
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs

from ..core.ir import Graph, Value
from ..core.mesh import AxisRef, Mesh
from ..propagation import Seed

# an uneven split (GSPMD pads the dim to a multiple of its shards) is one the search proposes
# when the padded dim is at most this many times the dim: 12 on 8 (16: 1.33x), a vocab of
# 50257 on 8 (1.0001x), 12 heads on 8, 28 on 8; not 9 on 8 (16: 1.78x, three shards empty)
MAX_PADDING = 1.5


def fair_split(n: int, k: int, even: bool = True) -> bool:
    """May a dim of size ``n`` split into ``k`` shards? ``even``: only when ``k`` divides it;
    else also unevenly, padded, when ``n >= k`` and the padding stays within ``MAX_PADDING``."""
    if n < k or k < 1:
        return False
    if n % k == 0:
        return True
    return not even and -(-n // k) * k <= MAX_PADDING * n


@attrs.frozen
class Leaf:
    """One flat input of the graph: which positional argument it belongs to (None: a keyword
    argument or a closed-over value), its key path inside that argument ("params/w1"), and
    its plan name ("arg0['params']['w1']")."""

    argnum: Optional[int]
    path: str
    name: str


@attrs.frozen
class TacticRecord:
    """What one tactic decided: its text, (value label, dim, axis) per decision, the predicted
    step after it (None when no hardware priced it), and the search's result for auto."""

    tactic: str
    decided: tuple[tuple[str, int, str], ...]
    step_s: Optional[float] = None
    result: object = None
    raw: tuple = ()  # (value id, dim, AxisRef) per decision
    note: str = ""  # why it decided nothing, when it did not run (auto with no axis left)


@attrs.define(eq=False)
class TacticContext:
    graph: Graph
    mesh: Mesh
    leaves: list[Leaf]
    base_seeds: list[Seed]  # the user's own: in_shardings and gp.annotate ops
    args_tree: object = None  # positional dynamic arguments as a pytree of avals (for rules)
    donate: tuple[int, ...] = ()
    decided: dict = attrs.Factory(dict)  # value id -> list per dim of [AxisRef]
    who: dict = attrs.Factory(dict)  # value id -> [tactic text]
    used_axes: list = attrs.Factory(list)  # mesh axis names earlier tactics named
    log: list = attrs.Factory(list)
    hardware: object = None  # the gp.Hardware the last auto tactic priced on (tactics.auto_hardware)
    # how a candidate's program is built: the compiler's pass records from partition to
    # reindex (partitioner/passes.py; None: PROGRAM_PASSES) and its combiner threshold
    passes: Optional[tuple] = None
    combine_threshold_bytes: Optional[int] = None
    out_leaves: list = attrs.Factory(list)  # per graph output: its Leaf (argnum: its position in the returned tuple)
    _fixed: set = attrs.field(init=False, factory=set)
    _values: dict = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self):
        self._fixed = {s.value.id for s in self.base_seeds}
        self._values = {v.id: v for v in self.graph.all_values()}

    # -- queries -------------------------------------------------------------------
    def fixed(self, v: Value) -> bool:
        return v.id in self._fixed

    def value(self, vid: int) -> Value:
        return self._values[vid]

    def dims(self, v: Value) -> list[list[AxisRef]]:
        return [list(d) for d in self.decided.get(v.id, [[] for _ in v.shape])]

    def can_add(self, v: Value, dim: int, axis: AxisRef, dims=None, even: bool = True,
                uneven: bool = False) -> bool:
        """Is ``axis`` free on ``v`` (not fixed, not yet used on any dim) and does dim ``dim``
        divide evenly by the shards it would then have (``uneven``: or split fairly,
        padded: ``fair_split``)? ``even=False``: any split."""
        if self.fixed(v) or v.is_const or dim >= v.rank:
            return False
        dims = self.dims(v) if dims is None else dims
        if any(a.name == axis.name for d in dims for a in d):
            return False
        if not even:
            return True
        k = axis.size
        for a in dims[dim]:
            k *= a.size
        return fair_split(v.shape[dim], k, even=not uneven)

    # -- decisions -----------------------------------------------------------------
    def add(self, v: Value, dim: int, axis: AxisRef, who: str, even: bool = True) -> bool:
        if not self.can_add(v, dim, axis, even=even):
            return False
        dims = self.dims(v)
        dims[dim].append(axis)
        self.decided[v.id] = dims
        w = self.who.setdefault(v.id, [])
        if who not in w:
            w.append(who)
        return True

    def seeds(self, extra: Optional[dict] = None, origin: str = "") -> list[Seed]:
        """The user's seeds plus one per decided value (``extra``: more decisions, value id ->
        dims, e.g. a search candidate's, on top of those made so far)."""
        out = list(self.base_seeds)
        merged = {k: [list(d) for d in v] for k, v in self.decided.items()}
        for vid, dims in (extra or {}).items():
            cur = merged.setdefault(vid, [[] for _ in dims])
            for d, axes in enumerate(dims):
                cur[d] = cur[d] + [a for a in axes if a not in cur[d]]
        for vid in sorted(merged):
            dims = merged[vid]
            if not any(dims):
                continue
            v = self._values[vid]
            who = list(self.who.get(vid, []))
            if extra and vid in extra and origin and origin not in who:
                who.append(origin)
            text = "tactic " + " + ".join(who) if who else "tactic"
            out.append(Seed(v, tuple(tuple(d) if d else None for d in dims), 0, text))
        return out

    def label(self, v: Value) -> str:
        if v.name:
            return v.name
        p = v.producer
        return f"%{v.id} ({p.prim}{', ' + p.source if p is not None and p.source else ''})" if p is not None \
            else f"%{v.id}"

    def free_axes(self) -> list[str]:
        return [a for a in self.mesh.axis_names if a not in self.used_axes]


def leaves_of_call(call, in_names: Sequence[str]) -> list[Leaf]:
    """Per dynamic leaf of a gp.spmd call: its positional argument and key path."""
    import jax

    from ..frontend.rules import slash_path

    tree = jax.tree_util.tree_unflatten(call.in_tree, [0] * len(call.leaves))
    pos_dyn = [i for i in range(call.n_args) if i not in call.static_pos]
    out = []
    for (path, _), name in zip(jax.tree_util.tree_flatten_with_path(tree)[0], in_names):
        if call.kw_form and path[0].idx == 1:
            out.append(Leaf(None, slash_path(path[1:]), name))
            continue
        path = path[1:] if call.kw_form else path
        out.append(Leaf(pos_dyn[path[0].idx], slash_path(path[1:]), name))
    return out


def out_leaves_of(out_tree, n: int) -> list[Leaf]:
    """Per output leaf of ``out_tree``: a Leaf whose ``argnum`` is its position in the returned
    tuple (None when the function returns no tuple or list) and ``path`` its key path inside it,
    as ``leaves_of_call`` says the inputs (``step(params, opt, x) -> (params, opt, loss)``:
    output 0's ``w1`` is argument 0's ``w1``). Empty when the tree does not have ``n`` leaves."""
    import jax

    from ..frontend.rules import slash_path

    if out_tree is None or out_tree.num_leaves != n:
        return []
    out = []
    for path, _ in jax.tree_util.tree_flatten_with_path(jax.tree_util.tree_unflatten(out_tree, [0] * n))[0]:
        head = path[0] if path else None
        idx = getattr(head, "idx", None)
        if isinstance(idx, int):
            out.append(Leaf(idx, slash_path(path[1:]), f"out{jax.tree_util.keystr(path)}"))
        else:
            out.append(Leaf(None, slash_path(path), f"out{jax.tree_util.keystr(path)}"))
    return out


def returned_state(ctx: "TacticContext") -> list[tuple[int, int]]:
    """(input id, output id) pairs of a training step's state: an output at the same pytree
    position and path as an input argument's leaf (``step(params, opt, batch) -> (params,
    opt, loss)``), of the same shape and dtype, neither fixed by the user."""
    outs = {(lf.argnum, lf.path): v for v, lf in zip(ctx.graph.outputs, ctx.out_leaves) if lf.argnum is not None}
    pairs = []
    for v, lf in zip(ctx.graph.inputs, ctx.leaves):
        o = outs.get((lf.argnum, lf.path))
        if o is None or lf.argnum is None or o.shape != v.shape or o.dtype != v.dtype or v.is_const:
            continue
        if ctx.fixed(v) or ctx.fixed(o) or v.rank == 0:
            continue
        pairs.append((v.id, o.id))
    return pairs


def tactics_text(records: Sequence[TacticRecord], shown: int = 8) -> str:
    """plan.report()'s tactics section: each tactic, what it decided, the predicted step after it."""
    lines = ["tactics, in order:"]
    for i, r in enumerate(records):
        step = f"step {r.step_s * 1e3:.4g} ms" if r.step_s is not None else ""
        lines.append(f"  {i + 1}. {r.tactic}: {len(r.decided)} decisions{', ' + step if step else ''}"
                     + (f" ({r.note})" if r.note else ""))
        for label, d, a in r.decided[:shown]:
            lines.append(f"       {label} dim {d} on {a}")
        if len(r.decided) > shown:
            lines.append(f"       ... {len(r.decided) - shown} more")
    return "\n".join(lines)
