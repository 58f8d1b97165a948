"""Between the compiler's passes: dump each pass's output as text, and verify invariants.

``PassRun`` is what ``compiler.plan_jaxpr`` hands each pass's result to, in order:

* ``GSPMD_PY_DUMP=dir``: each pass's output is written as text (pass_text.py) to
  ``dir/<function name>-<digest>/<NN>-<pass>.txt``: ``NN`` the pass's position in this
  plan's run (a pass run twice, as partition is when collective matmuls are compared, gets
  two numbers), ``digest`` the first 10 hex digits of the SHA-1 of the traced graph's text,
  so the names are the same on every run of the same program and two programs of one
  function name do not share a folder. The last file, ``NN-collectives.txt``, lists the
  plan's collective records.
* ``GSPMD_PY_VERIFY=1`` (tests/conftest.py sets it): after each pass its invariants are
  checked (``verify``) and a broken one raises ``PassInvariantError`` naming the pass:

  - propagate: every value of the graph (regions included) has a sharding of its rank;
  - partition: every value has a sharding; no output is returned as a partial value (each
    partial is reduced before it leaves the program); a partial value's reduction axes
    are not axes its dims are sharded over, and none is named twice (reduced once);
  - index / reindex: the program's collective equations and the records agree one to one
    (each collective primitive has exactly one record, nothing else has one, each names an
    op of the graph or the boundary); reindex's records equal a fresh index of the
    combined program.
* ``GSPMD_PY_VERIFY=plan``: all of the above, and at the end the finished plan is checked by
  ``check_plan`` (plan_check.py: partial values reduced exactly once, permutes, padding).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Optional

import attrs

from . import pass_text
from ..core.errors import ShardingError
from ..ops import facts_of
from ..partitioner.passes import index_program

DUMP_ENV = "GSPMD_PY_DUMP"
VERIFY_ENV = "GSPMD_PY_VERIFY"


class PassInvariantError(ShardingError):
    """A compiler pass broke an invariant the next pass relies on (a bug in gspmd_py)."""


@attrs.define
class PassRun:
    """One plan's run of the passes: where to dump (None: nowhere), whether to verify."""

    name: str
    mesh: Any
    dump_dir: Optional[Path] = None
    verify: bool = False
    count: int = 0
    folder: Optional[Path] = None

    @classmethod
    def from_env(cls, name: str, mesh) -> "PassRun":
        d = os.environ.get(DUMP_ENV, "")
        return cls(name, mesh, Path(d) if d else None, os.environ.get(VERIFY_ENV, "") not in ("", "0"))

    def __call__(self, pass_name: str, result, **context):
        """Record ``result``, the output of ``pass_name``: dump it, verify it; returns it."""
        self.count += 1
        if self.verify:
            verify(pass_name, result, self.mesh, **context)
        if self.dump_dir is not None:
            self._dump(pass_name, text_of(pass_name, result, self.mesh, **context))
        return result

    def _dump(self, pass_name: str, text: str) -> None:
        if self.folder is None:  # the first pass is trace: its text names the program
            digest = hashlib.sha1(text.encode()).hexdigest()[:10]
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in self.name) or "f"
            self.folder = self.dump_dir / f"{safe}-{digest}"
            self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"{self.count:02d}-{pass_name}.txt").write_text(text + "\n")

    def finish(self, plan) -> None:
        """After the last pass: the plan's collective records, dumped; with
        ``GSPMD_PY_VERIFY=plan``, the whole plan checked statically (plan_check.py)."""
        if self.verify and os.environ.get(VERIFY_ENV, "") == "plan":
            from .plan_check import check_plan  # a sibling, loaded when asked for

            found = check_plan(plan)
            if found:
                raise PassInvariantError(f"the plan of {self.name}: " + "; ".join(map(str, found[:8])))
        if self.dump_dir is not None:
            self.count += 1
            self._dump("collectives", pass_text.collectives_text(plan.index))


def text_of(pass_name: str, result, mesh, **context) -> str:
    """The text a pass's output dumps as (pass_text.py)."""
    if pass_name in ("trace", "fold_shifts"):
        return pass_text.graph_text(result)
    if pass_name in ("seed", "apply_tactics"):
        return pass_text.seeds_text(result.seeds)
    if pass_name == "propagate":
        return pass_text.propagation_text(context["graph"], mesh, result)
    if pass_name == "partition":
        return str(result.program)  # JAX's text of the per-device program; ``index`` prints ours
    if pass_name in ("index", "reindex"):
        return pass_text.program_text(result) + "\n\ncollectives:\n" + pass_text.collectives_text(result)
    if pass_name == "combine":
        return str(result)
    if pass_name == "choose_matmul":
        return "\n".join(n for n in result.diagnostics.notes if "collective matmul" in n) or "(no collective matmul)"
    raise ValueError(f"no text for pass {pass_name!r}")


def verify(pass_name: str, result, mesh, **context) -> None:
    """Check the invariants that hold after ``pass_name`` (see the module doc)."""
    if pass_name == "propagate":
        _every_value_sharded(pass_name, context["graph"], lambda v: result.dims_of(v))
    elif pass_name == "partition":
        graph = context["graph"]
        _every_value_sharded(pass_name, graph, lambda v: result.shardings[v.id].dims)
        _partials_reduced(result, graph)
    elif pass_name in ("index", "reindex"):
        _collectives_match(pass_name, result, {op.id for op in context["graph"].walk()})
        if pass_name == "reindex" and result is not context["raw"]:
            fresh = index_program(result.program, context["part"].fine, context["graph"])
            if list(fresh.collectives) != list(result.collectives):
                raise PassInvariantError("reindex: the records differ from a fresh index of the combined program")


def _every_value_sharded(pass_name: str, graph, dims_of) -> None:
    for v in graph.all_values():
        try:
            dims = dims_of(v)
        except KeyError:
            raise PassInvariantError(f"{pass_name}: value {v!r} has no sharding") from None
        if len(dims) != v.rank:
            raise PassInvariantError(f"{pass_name}: value {v!r} has a sharding of rank {len(dims)}")


def _partials_reduced(part, graph) -> None:
    held = part.diagnostics.held
    for v in graph.outputs:
        h = held.get(v.id)
        if h is not None and h.partial is not None:
            raise PassInvariantError(f"partition: output %{v.id} is returned as a partial {h.partial.op} over "
                                     f"{h.partial.axes}, never reduced")
    for vid, h in held.items():
        if h.partial is None:
            continue
        axes = list(h.partial.axes)
        sharded = {a for d in h.dims for a in d}
        if len(set(axes)) != len(axes) or sharded & set(axes):
            raise PassInvariantError(f"partition: value %{vid} is partial over {tuple(axes)} while sharded over "
                                     f"{tuple(sorted(sharded))}: a reduction would count a shard twice")


def _collectives_match(pass_name: str, idx, op_ids: set) -> None:
    for e in idx.entries:
        want = 1 if facts_of(e.prim).collective else 0
        if len(e.collectives) != want:
            raise PassInvariantError(f"{pass_name}: equation {e.path} ({e.prim}, {e.label}) has "
                                     f"{len(e.collectives)} collective records, expected {want}")
        for c in e.collectives:
            if c.op_id != -1 and c.op_id not in op_ids:
                raise PassInvariantError(f"{pass_name}: collective {c} names op {c.op_id}, not an op of the graph")
