"""A brute-force validator of layout chains (as PyTorch DTensor ships one for its placements).

A *chain* starts from one kind of value and takes 2-3 steps, each a layout step or an op
that may keep a partial value unreduced; the partitioned chain must equal the plain one::

    Chain(mesh (2,4), shape (3, 5), start=partial sum over {y},
          steps=[neg, annotate P(None, None), annotate P('y', None)], out=None)

    start   replicated | sharded P(...) | partial sum / max / min / pick over an axis set
            (a sum/max/min over, or a dynamic index into, a leading dim sharded over the set)
    steps   annotate P(...)            gp.annotate with any spec of the mesh for the rank
            tag                        gp.tag (names, does not constrain)
            neg, scale                 -v, v * 3 (a plan-time constant: keeps a partial sum)
            add                        v + w, w the twin chain over the second input (two
                                       partials of one kind over the same axes)
            select                     where(constant mask, v, w)
            reduce_sum                 over dim 0 (rank 2 -> 1)
            transpose, reshape         (a, b) -> (b, a); (a, b) -> (a*b,), (n,) -> (n, 1)
    out     out_shardings of the result (any spec), or None

Values are small integers held in float32 (sums exact in any order, so a partial reduced
twice shows as a multiple), with -0.0 and +-inf for max / min / pick starts. Many chains
are partitioned as ONE gp.spmd program (disjoint subgraphs, each with its own inputs and
output): planning and compiling cost is paid per batch, and a mismatch names its chain.

``chains(mesh_index)`` enumerates every chain of a mesh in a fixed order; the test module
runs a stratified sample in CI and the whole sweep with GSPMD_PY_SWEEP=1.
"""
from __future__ import annotations

import itertools
from typing import Iterator, Optional

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

# (mesh shape, names) of the sweep: one axis, two axes of unequal size, three equal axes
SWEEP_MESHES = (((8,), ("x",)), ((2, 4), ("x", "y")), ((2, 2, 2), ("x", "y", "z")))
# even, uneven, a size-1 dim, an empty dim; the leading dim a partial start reduces
SHAPES = ((4, 8), (3, 5), (1, 6), (0, 4))
LEAD = {(4, 8): 8, (3, 5): 13, (1, 6): 8, (0, 4): 8}
PARTIAL_OPS = ("sum", "max", "min", "pick")
OPS = ("neg", "scale", "add", "select", "reduce_sum", "transpose", "reshape", "tag")


@attrs.frozen
class Chain:
    mesh: int  # index into SWEEP_MESHES
    shape: tuple  # the start value's shape (rank 2)
    start: tuple  # ("replicated",) | ("sharded", spec) | ("partial", op, axes)
    steps: tuple  # ("annotate", spec) | (op name,)
    out: Optional[gp.P] = None

    def __str__(self) -> str:
        shape, names = SWEEP_MESHES[self.mesh]
        start = {"replicated": lambda: "replicated", "sharded": lambda: f"sharded {self.start[1]}",
                 "partial": lambda: f"partial {self.start[1]} over {set(self.start[2])}"}[self.start[0]]()
        steps = ", ".join(s[0] if len(s) == 1 else f"annotate {s[1]}" for s in self.steps)
        return f"mesh {shape}: {shape_str(self.shape)} {start} -> [{steps}] -> out {self.out}"

    # -- the program ---------------------------------------------------------------------------

    def source_shape(self) -> tuple:
        return (LEAD[self.shape],) + self.shape if self.start[0] == "partial" else self.shape

    def in_spec(self) -> Optional[gp.P]:
        kind = self.start[0]
        if kind == "replicated":
            return gp.P(None, None)
        if kind == "sharded":
            return self.start[1]
        axes = self.start[2]
        return gp.P(axes if len(axes) > 1 else axes[0], None, None)

    def begin(self, x, i):
        if self.start[0] != "partial":
            return x
        op = self.start[1]
        if op == "sum":
            return jnp.sum(x, axis=0)
        if op == "max":
            return jnp.max(x, axis=0)
        if op == "min":
            return jnp.min(x, axis=0)
        return lax.dynamic_index_in_dim(x, i, 0, keepdims=False)  # pick: one device holds the row

    def run(self, x, y, i):
        v, w = self.begin(x, i), self.begin(y, i)
        for k, step in enumerate(self.steps):
            name = step[0]
            if name == "annotate":
                v = gp.annotate(v, step[1])
            elif name == "tag":
                v = gp.tag(v, f"step{k}")  # one source line: the name may repeat across chains
            elif name == "neg":
                v, w = -v, -w
            elif name == "scale":
                v, w = v * 3.0, w * 3.0
            elif name == "add":
                v = v + w
            elif name == "select":
                mask = np.arange(int(np.prod(v.shape))).reshape(v.shape) % 3 == 1
                v = jnp.where(mask, v, w)
            elif name == "reduce_sum":
                v, w = jnp.sum(v, axis=0), jnp.sum(w, axis=0)
            elif name == "transpose":
                v, w = v.T, w.T
            elif name == "reshape":
                new = (v.size,) if v.ndim == 2 else (v.shape[0], 1)
                v, w = v.reshape(new), w.reshape(new)
            else:
                raise ValueError(name)
        return v

    def args(self, seed: int):
        rng = np.random.default_rng(seed)
        shape = self.source_shape()
        xs = []
        for _ in range(2):
            a = rng.integers(-4, 5, size=shape).astype(np.float32)
            if self.start[0] == "partial" and self.start[1] != "sum" and a.size:
                flat = a.reshape(-1)
                flat[rng.integers(0, flat.size, 3)] = -0.0
                flat[rng.integers(0, flat.size)] = np.inf
                flat[rng.integers(0, flat.size)] = -np.inf
            xs.append(a)
        return xs[0], xs[1], np.int32(rng.integers(0, shape[0]) if shape[0] else 0)


def shape_str(shape) -> str:
    return "f32[" + ",".join(map(str, shape)) + "]"


def rank_after(shape: tuple, steps: tuple) -> Optional[int]:
    """The rank after ``steps`` (None where a step does not apply: reduce_sum of rank 1,
    transpose of rank 1)."""
    rank = len(shape)
    for s in steps:
        if s[0] == "reduce_sum":
            if rank != 2:
                return None
            rank = 1
        elif s[0] == "transpose" and rank != 2:
            return None
        elif s[0] == "reshape":
            rank = 1 if rank == 2 else 2
    return rank


def specs(names: tuple, rank: int) -> list[gp.P]:
    """Every spec that puts each mesh axis on at most one dim (in mesh order within a dim)."""
    out = []
    for choice in itertools.product(range(rank + 1), repeat=len(names)):  # rank == unused
        entries = []
        for d in range(rank):
            axes = tuple(a for a, c in zip(names, choice) if c == d)
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        out.append(gp.P(*entries))
    return out


def axis_sets(names: tuple) -> list[tuple]:
    return [c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]


def starts(names: tuple) -> list[tuple]:
    out = [("replicated",)]
    out += [("sharded", s) for s in specs(names, 2) if any(e is not None for e in s)]
    out += [("partial", op, axes) for op in PARTIAL_OPS for axes in axis_sets(names)]
    return out


def canonical(names: tuple, start: tuple) -> bool:
    """Is ``start`` the first of its class under permutations of equal-size mesh axes? (On
    (2, 2, 2) a partial over {y} behaves as one over {x}; the steps still take every spec.)"""
    if start[0] == "partial":
        return start[2] == names[: len(start[2])]
    if start[0] == "sharded":  # the axes fill the dims in mesh order: x first, then y, then z
        used = [a for e in start[1] if e is not None for a in (e if isinstance(e, tuple) else (e,))]
        return used == list(names[: len(used)])
    return True


def chains(mesh_index: int, lengths=(2,), shapes=SHAPES) -> Iterator[Chain]:
    """Every chain on a sweep mesh, in a fixed order: each shape, each start (partial starts
    up to a permutation of equal-size axes), each sequence of ``lengths`` steps from the
    annotations (any spec of the mesh) and the ops, the last one possibly ``out_shardings``
    (any spec) instead; at least one step is a layout step (an annotation or the output)."""
    shape_, names = SWEEP_MESHES[mesh_index]
    equal = len(set(shape_)) == 1
    spec_steps = {r: [("annotate", s) for s in specs(names, r)] for r in (1, 2)}
    for shape in shapes:
        for start in starts(names):
            if equal and not canonical(names, start):
                continue
            for n in lengths:
                yield from _walk(mesh_index, shape, start, (), n, spec_steps, names)


def _walk(mi, shape, start, steps, n, spec_steps, names):
    rank = rank_after(shape, steps)
    if len(steps) == n - 1:
        for step in [(o,) for o in OPS] + spec_steps[rank]:
            full = steps + (step,)
            if rank_after(shape, full) is not None and any(s[0] == "annotate" for s in full):
                yield Chain(mi, shape, start, full, None)
        for out in specs(names, rank):
                yield Chain(mi, shape, start, steps, out)
        return
    for step in [(o,) for o in OPS] + spec_steps[rank]:
        if rank_after(shape, steps + (step,)) is not None:
            yield from _walk(mi, shape, start, steps + (step,), n, spec_steps, names)


# the full sweep: every chain of 2-3 steps on (8,), of 2 steps on (2, 4), of 2 steps of the
# uneven shape on (2, 2, 2) (its starts up to axis permutations)
SWEEP = ((0, (2, 3), SHAPES), (1, (2,), SHAPES), (2, (2,), ((3, 5),)))


def sweep() -> Iterator[Chain]:
    for mi, lengths, shapes in SWEEP:
        yield from chains(mi, lengths, shapes)


# -- running -----------------------------------------------------------------------------------------

def _mesh(mi: int) -> gp.Mesh:
    shape, names = SWEEP_MESHES[mi]
    return gp.Mesh(shape, names)


def run_batch(batch: list[Chain], seed: int = 0) -> list[str]:
    """Partition ``batch`` (chains of one mesh) as one program; the mismatches, described."""
    mesh = _mesh(batch[0].mesh)

    def fn(*flat):
        return tuple(c.run(*flat[3 * k: 3 * k + 3]) for k, c in enumerate(batch))

    args = [a for k, c in enumerate(batch) for a in c.args(seed + k)]
    in_specs = tuple(s for c in batch for s in (c.in_spec(), c.in_spec(), None))
    f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=tuple(c.out for c in batch))
    got = f(*args)
    want = jax.jit(fn)(*args)
    bad = []
    for c, g, w in zip(batch, got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or not np.array_equal(g, w, equal_nan=True):
            bad.append(f"{c}: got {g.tolist()} want {w.tolist()}")
    return bad
