"""Every process must run the same SPMD program: a check at a function's first call.

On a multi-process run each process traces, propagates and partitions on its own; if
one of them planned something else (rank-dependent code, a different input shape, a
nondeterministic choice), their collectives would not match and the run would hang.
``check_same_program(plan)`` all-gathers a 128-bit digest of the plan's program (a tiny
all-gather through JAX) and, when digests differ, fetches the differing processes'
program lines from JAX's distributed key-value store to name the first differing op.

    lines, _ = program_lines(plan)     # "input 0 f32[8,16] P('x', None)", "op tanh (f32[8,32]) -> (f32[8,32])", ...
    digest(lines)                      # 32 hex digits, the same on every process planning the same program
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..core import jax_compat as compat
from ..core.errors import ShardingError


class ProgramMismatchError(ShardingError):
    """Processes of a multi-process run planned different programs."""


_KV_PREFIX = "gspmd_py/program/"
_KV_TIMEOUT_MS = 60_000


def program_lines(plan) -> tuple[list[str], list[str]]:
    """The plan's program as lines (inputs, ops, collectives, per-device program) and, per
    line, where it comes from (the user's source line for an op). Only the first list is
    compared across processes: it holds no paths, addresses or hash-ordered text."""
    lines, where = [], []
    g = plan.graph
    for i, (v, spec) in enumerate(zip(g.inputs, plan.in_specs)):
        lines.append(f"input {i} {v.type_str} {spec}")
        where.append(f"input {i}")
    for k, op in enumerate(g.walk()):
        ins = ", ".join(v.type_str for v in op.inputs)
        outs = ", ".join(v.type_str for v in op.outputs)
        lines.append(f"op {op.prim} ({ins}) -> ({outs})")
        where.append(f"op {k} ({op.prim}{' at ' + op.source if op.source else ''})")
    for j, (v, spec) in enumerate(zip(g.outputs, plan.out_specs)):
        lines.append(f"output {j} {v.type_str} {spec}")
        where.append(f"output {j}")
    for j, c in enumerate(plan.collectives):
        lines.append(f"collective {c.kind} {tuple(c.axes)} {c.bytes_per_device}")
        where.append(f"collective {j} ({c.kind} over {tuple(c.axes)})")
    for j, line in enumerate(plan.spmd_text().splitlines()):
        lines.append("spmd " + line.strip())
        where.append(f"line {j} of the per-device program")
    return lines, where


def digest(lines: list[str]) -> str:
    """128-bit hex digest of program lines."""
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()[:32]


def first_difference(mine: list[str], theirs: list[str]) -> int:
    """Index of the first line where two programs differ (the shorter length if one is a prefix)."""
    for i, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return i
    return min(len(mine), len(theirs))


def mismatch_message(fn_name: str, me: int, other: int, mine: list[str], where: list[str],
                     theirs: list[str] | None) -> str:
    """The error text: which processes differ and at which op."""
    head = (f"gp.spmd({fn_name}): processes {min(me, other)} and {max(me, other)} planned different "
            f"programs (running them would deadlock)")
    if theirs is None:
        return head + f"; process {other}'s program could not be fetched to name the op"
    i = first_difference(mine, theirs)
    short = lambda s: s if len(s) <= 160 else s[:157] + "..."
    here = short(mine[i]) if i < len(mine) else "<end of program>"
    there = short(theirs[i]) if i < len(theirs) else "<end of program>"
    at = where[i] if i < len(where) else "the end of the program"
    return (f"{head}: first difference at {at}: process {me} has `{here}`, process {other} has `{there}`")


def check_same_program(plan) -> None:
    """On a multi-process run, raise ProgramMismatchError unless every process planned ``plan``'s
    program; a no-op on one process. Every process must call it at the same point (it is a
    collective); ``Lowered.check_same_program`` (stages.py) calls it once per plan."""
    import jax

    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    lines, where = program_lines(plan)
    mine = digest(lines)
    words = np.frombuffer(bytes.fromhex(mine), dtype=np.int32)
    every = np.asarray(multihost_utils.process_allgather(words)).reshape(jax.process_count(), -1)
    hexes = [np.ascontiguousarray(r, dtype=np.int32).tobytes().hex() for r in every]
    if all(h == hexes[0] for h in hexes):
        return
    me = jax.process_index()
    # compare with process 0, or (when this process agrees with it) with the first that does not
    other = 0 if hexes[me] != hexes[0] else next(i for i, h in enumerate(hexes) if h != hexes[0])
    theirs = _exchange(mine, "\n".join(lines), hexes[other])
    raise ProgramMismatchError(mismatch_message(getattr(plan, "fn_name", "fn"), me, other, lines, where, theirs))


def _exchange(mine_hex: str, text: str, theirs_hex: str) -> list[str] | None:
    """Publish this program under its digest; fetch the program published under ``theirs_hex``."""
    client = compat.distributed_client()  # JAX's own (multihost_utils and array serialization use it)
    if client is None:
        return None
    client.key_value_set(_KV_PREFIX + mine_hex, text, allow_overwrite=True)
    try:
        return client.blocking_key_value_get(_KV_PREFIX + theirs_hex, _KV_TIMEOUT_MS).split("\n")
    except Exception:  # the other process died or never published: report without the op
        return None
