"""Random small programs (3-8 ops over random, often uneven, sometimes empty shapes) with
random input shardings and gp.annotate at random points (single, or chains of two
layouts, after a sum kept partial too), loops (lax.scan) with sharded carries and
constants, on the four 8-device meshes, in
every dtype users bring (float32, bfloat16, float16, int32, int8, bool) and with the
values that break partitioners (0, -0.0, +-inf, NaN, the smallest normal, values near the
dtype's max): the partitioned result equals the unpartitioned one.

Equality, per output, by what computed it (``_analyze``):

* exact (integers, bools; floats moved, compared, negated, maxed, sorted, ...): the same
  bits as the unpartitioned program (NaN == NaN, signs of zeros and infinities), except
  that a max/min reduction may return either zero of -0.0 and +0.0 (IEEE 754 leaves the
  choice open; a reduction in another order picks the other one);
* float arithmetic (sums, dots, softmax, exp, ...; rounded in another order): NaN where
  NaN, the same infinities, finite values within ``TOL[dtype] * eps * (|want| + scale)``,
  ``scale`` the largest finite magnitude among the values the output was computed from.

The reference is the same function under jax.jit on one device (compiled, so XLA's fusion
rounds the same way; for exact outputs this is jax.jit's answer; XLA's own *partitioned*
answer is not used: it drops NaN in max/min all-reduces and overflows float16 partial sums).

Values near the dtype's max are drawn only where no accumulation of them happens: a sum,
dot or cumsum of such a value first clips it (``tame``), since overflow in a sum depends on
its order. Set GSPMD_PY_FUZZ=1 for thousands of programs; GSPMD_PY_FUZZ_REPORT=path writes
per-dtype counts (and, with GSPMD_PY_FUZZ_KEEP_GOING=1, every mismatch instead of stopping).
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import (EXACT, EXACT_UP_TO_ZERO_SIGN, FUZZ_DTYPES, INEXACT, MESH_SHAPES, examples, fuzz_diff,
                            fuzz_values, mesh_of, np_dtype, report_problems, spec_for)

DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 0)
MAX_ELEMS = 4096

# tolerance of float arithmetic in epsilons of the dtype (see the module docstring)
TOL = {"float32": 8, "bfloat16": 8, "float16": 8}

FLOAT_UNARY = {
    "tanh": jnp.tanh, "exp": lambda v: jnp.exp(jnp.clip(v, -5, 5)), "neg": jnp.negative, "abs": jnp.abs,
    "sin": jnp.sin, "square": lambda v: v * v, "relu": jax.nn.relu, "scale": lambda v: v * 0.5 + 1.0,
    "floor_cvt": lambda v: jnp.floor(v).astype(jnp.int32).astype(v.dtype),
    "tame": lambda v: jnp.clip(v, -4, 4),
}
INT_UNARY = {"neg": jnp.negative, "abs": jnp.abs, "square": lambda v: v * v, "relu": jax.nn.relu,
             "scale": lambda v: v * 3 + 1}  # weakly typed literals: int8 * 3 stays int8
BOOL_UNARY = {"not": jnp.logical_not, "square": lambda v: v * v}
FLOAT_BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "select": lambda a, b: jnp.where(a > b, a - b, 0.0), "div": lambda a, b: a / (1.0 + jnp.abs(b)),
}
INT_BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "select": lambda a, b: jnp.where(a > b, a - b, 0), "div": lambda a, b: lax.div(a, 1 + jnp.abs(b)),
    "and": jnp.bitwise_and, "or": jnp.bitwise_or, "xor": jnp.bitwise_xor,
}
BOOL_BINARY = {"add": jnp.add, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
               "select": lambda a, b: jnp.where(a, ~b, b), "and": jnp.logical_and, "or": jnp.logical_or,
               "xor": jnp.logical_xor}
# float ops whose result is the exact value of an operand (no rounding anywhere)
EXACT_FLOAT_OPS = {"neg", "abs", "relu", "floor_cvt", "tame", "max", "min"}
# floats: discontinuous ops (floor) only read program inputs (a rounding difference upstream
# would move their result by a whole unit)
INPUT_ONLY = {"floor_cvt"}
REDUCERS = {"sum": None, "max": jnp.max, "min": jnp.min, "and": lax.reduce_and, "or": lax.reduce_or,
            "xor": lax.reduce_xor}


def family(dtype: str) -> str:
    return "bool" if dtype == "bool" else "int" if dtype.startswith("int") else "float"


def unary_ops(dtype):
    return {"float": FLOAT_UNARY, "int": INT_UNARY, "bool": BOOL_UNARY}[family(dtype)]


def binary_ops(dtype):
    return {"float": FLOAT_BINARY, "int": INT_BINARY, "bool": BOOL_BINARY}[family(dtype)]


def reducers(dtype, empty_axis: bool):
    names = {"float": ["sum", "max", "min"], "int": ["sum", "max", "min", "and", "or", "xor"],
             "bool": ["max", "min", "and", "or", "xor"]}[family(dtype)]
    return [n for n in names if not (empty_axis and n in ("max", "min"))]  # no identity: jnp refuses


# drawn uniformly: binary and annotate twice as often as the others
OP_KINDS = ("unary", "binary", "binary", "transpose", "reshape", "broadcast", "reduce", "dot", "concat", "slice",
            "cumsum", "cummax", "softmax", "sort", "argmax", "take", "annotate", "annotate", "annotate_chain",
            "partial_chain", "scan")
NOT_FOR = {"bool": {"cumsum", "cummax", "softmax"}, "int": {"softmax"}, "float": set()}
N_OPS = (3, 8)
N_INPUTS = (1, 2)
VALUE_MODES = ("plain", "special", "huge")


@attrs.frozen
class Program:
    mesh: int
    inputs: tuple  # ((shape, spec[, value mode]), ...)
    ops: tuple  # (("kind", args...), ...); each op makes one new value
    outputs: tuple  # value indices
    out_specs: tuple
    dtype: str = "float32"

    def __call__(self, *args):
        env = self.all_values(*args)
        return tuple(env[i] for i in self.outputs)

    def all_values(self, *args):
        env = list(args)
        for op in self.ops:
            env.append(_apply(op, env, self.dtype))
        return env

    def args(self):
        return tuple(fuzz_values(inp[0], np_dtype(self.dtype), i, inp[2] if len(inp) > 2 else "plain")
                     for i, inp in enumerate(self.inputs))


def _apply(op, env, dtype):
    kind = op[0]
    if kind == "unary":
        return unary_ops(dtype)[op[1]](env[op[2]])
    if kind == "binary":
        return binary_ops(dtype)[op[1]](env[op[2]], env[op[3]])
    if kind == "bcast_binary":  # a (bigger) op b, b broadcast along the dims it lacks
        _, name, a, b, dims = op
        return binary_ops(dtype)[name](env[a], jnp.expand_dims(env[b], dims))
    if kind == "transpose":
        return jnp.transpose(env[op[1]], op[2])
    if kind == "reshape":
        return jnp.reshape(env[op[1]], op[2])
    if kind == "broadcast":
        _, a, pos, size = op
        x = jnp.expand_dims(env[a], pos)
        shape = list(x.shape)
        shape[pos] = size
        return jnp.broadcast_to(x, tuple(shape))
    if kind == "reduce":
        _, name, a, axes, keep = op
        x = env[a]
        if name == "sum":
            return jnp.sum(x, axis=axes, keepdims=keep, dtype=x.dtype)
        if name in ("max", "min"):
            return REDUCERS[name](x, axis=axes, keepdims=keep)
        y = REDUCERS[name](x, axes)
        return jnp.expand_dims(y, axes) if keep else y
    if kind == "dot":  # contract dim i of a with dim j of b
        _, a, b, i, j = op
        return jnp.tensordot(env[a], env[b], axes=((i,), (j,)))
    if kind == "concat":
        _, a, b, axis = op
        return jnp.concatenate([env[a], env[b]], axis=axis)
    if kind == "slice":
        _, a, axis, start, stop, step = op
        idx = [slice(None)] * env[a].ndim
        idx[axis] = slice(start, stop, step)
        return env[a][tuple(idx)]
    if kind == "cumsum":
        _, a, axis, reverse = op
        return lax.cumsum(env[a], axis=axis, reverse=reverse)
    if kind == "cummax":
        _, a, axis, reverse = op
        return lax.cummax(env[a], axis=axis, reverse=reverse)
    if kind == "softmax":
        return jax.nn.softmax(env[op[1]], axis=op[2])
    if kind == "sort":
        return jnp.sort(env[op[1]], axis=op[2])
    if kind == "argmax":
        return jnp.argmax(env[op[1]], axis=op[2]).astype(np_dtype(dtype))
    if kind == "take":
        _, a, axis, idx = op
        return jnp.take(env[a], np.asarray(idx, np.int32), axis=axis)
    if kind == "annotate":
        return gp.annotate(env[op[1]], op[2])
    if kind == "scan":  # a loop: carry a, constant b, `length` steps of carry = a op b (annotated)
        _, name, a, b, length, spec, ys = op
        f = binary_ops(dtype)[name]

        def body(c, _):
            c = f(c, env[b])
            c = c if spec is None else gp.annotate(c, spec)
            return c, c

        carry, stacked = lax.scan(body, env[a], None, length=length)
        return stacked if ys else carry
    raise ValueError(kind)


def _operands(op) -> tuple[int, ...]:
    kind = op[0]
    if kind in ("unary", "reduce"):
        return (op[2],)
    if kind in ("binary", "bcast_binary", "scan"):
        return (op[2], op[3])
    if kind in ("dot", "concat"):
        return (op[1], op[2])
    return (op[1],)


def _exactness(op, operands: list[int], dtype: str) -> int:
    """EXACT / EXACT_UP_TO_ZERO_SIGN / INEXACT of an op's result (module docstring)."""
    e = min(operands) if operands else EXACT
    if family(dtype) != "float":
        return EXACT
    kind = op[0]
    if kind in ("transpose", "reshape", "broadcast", "concat", "slice", "sort", "take", "annotate"):
        return e
    if kind == "argmax":
        return EXACT
    if kind in ("unary", "binary", "bcast_binary", "scan"):
        return e if op[1] in EXACT_FLOAT_OPS else INEXACT
    if kind == "cummax" or (kind == "reduce" and op[1] in ("max", "min")):
        return min(e, EXACT_UP_TO_ZERO_SIGN)
    return INEXACT  # reduce sum, dot, cumsum, softmax


ACCUMULATING = {"dot", "cumsum"}


def _analyze(prog: Program):
    """Per value: (exactness, holds values near the dtype's max, indices it was computed from)."""
    info = [(EXACT, len(inp) > 2 and inp[2] == "huge", frozenset([i])) for i, inp in enumerate(prog.inputs)]
    for op in prog.ops:
        ins = _operands(op)
        e = _exactness(op, [info[i][0] for i in ins], prog.dtype)
        tamed = op[0] == "unary" and op[1] == "tame"
        huge = any(info[i][1] for i in ins) and not tamed
        info.append((e, huge, frozenset().union(*[info[i][2] for i in ins]) | {len(info)}))
    return info


def _factorizations(n):
    return [(d, n // d) for d in range(2, n) if n % d == 0]


@st.composite
def programs(draw):
    mi = draw(st.integers(0, len(MESH_SHAPES) - 1))
    mesh = mesh_of(mi)
    dtype = draw(st.sampled_from(FUZZ_DTYPES))
    fam = family(dtype)
    n_in = draw(st.integers(*N_INPUTS))
    inputs = []
    shapes = []
    huge = []
    for _ in range(n_in):
        shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3)))
        spec = draw(st.one_of(st.none(), spec_for(mesh, len(shape), sub_axes=True)))
        mode = draw(st.sampled_from(VALUE_MODES if fam != "bool" else ("plain",)))
        inputs.append((shape, spec, mode))
        shapes.append(shape)
        huge.append(mode == "huge" and fam == "float")
    ops = []
    count = draw(st.integers(*N_OPS))

    def add(op, new_shape):
        ops.append(op)
        shapes.append(new_shape)
        ins = _operands(op)
        huge.append(any(huge[i] for i in ins) and not (op[0] == "unary" and op[1] == "tame"))
        return len(shapes) - 1

    for _ in range(count):
        # mostly chain on the latest values, so programs are deep rather than wide
        idx = len(shapes) - 1 - min(draw(st.integers(0, len(shapes) - 1)), draw(st.integers(0, 2)))
        shape = shapes[idx]
        rank = len(shape)
        kind = draw(st.sampled_from(OP_KINDS))
        if kind in NOT_FOR[fam]:
            continue
        if fam == "float" and huge[idx] and kind in ACCUMULATING:
            idx = add(("unary", "tame", idx), shape)  # a sum of values near the max overflows by its order
        op = None
        new_shape = None
        if kind == "unary":
            names = sorted(unary_ops(dtype))
            if fam == "float" and idx >= n_in:
                names = sorted(set(names) - INPUT_ONLY)
            op, new_shape = ("unary", draw(st.sampled_from(names)), idx), shape
        elif kind == "binary":
            same = [i for i, s in enumerate(shapes) if s == shape]
            lower = [i for i, s in enumerate(shapes) if 0 < len(s) < rank and s == shape[rank - len(s):]]
            name = draw(st.sampled_from(sorted(binary_ops(dtype))))
            if lower and draw(st.booleans()):
                b = draw(st.sampled_from(lower))
                dims = tuple(range(rank - len(shapes[b])))
                op, new_shape = ("bcast_binary", name, idx, b, dims), shape
            else:
                op, new_shape = ("binary", name, idx, draw(st.sampled_from(same))), shape
        elif kind == "transpose" and rank >= 2:
            perm = tuple(draw(st.permutations(range(rank))))
            op, new_shape = ("transpose", idx, perm), tuple(shape[p] for p in perm)
        elif kind == "reshape":
            choices = []
            for d in range(rank - 1):  # merge two adjacent dims
                choices.append(shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2:])
            for d in range(rank):  # split a dim
                if rank < 4:
                    for a, b in _factorizations(shape[d]):
                        choices.append(shape[:d] + (a, b) + shape[d + 1:])
            if rank > 1:
                choices.append((math.prod(shape),))
            if choices:
                new_shape = draw(st.sampled_from(choices))
                op = ("reshape", idx, new_shape)
        elif kind == "broadcast" and rank < 4:
            pos = draw(st.integers(0, rank))
            size = draw(st.sampled_from(DIMS))
            new_shape = shape[:pos] + (size,) + shape[pos:]
            op = ("broadcast", idx, pos, size)
        elif kind == "reduce":
            axes = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))))
            keep = draw(st.booleans()) or len(axes) == rank
            name = draw(st.sampled_from(reducers(dtype, any(shape[d] == 0 for d in axes))))
            if name == "sum" and fam == "float" and huge[idx]:
                idx = add(("unary", "tame", idx), shape)
            op = ("reduce", name, idx, axes, keep)
            new_shape = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keep else \
                tuple(n for d, n in enumerate(shape) if d not in axes)
        elif kind == "dot":
            i = draw(st.integers(0, rank - 1))
            partners = [(b, j) for b, s in enumerate(shapes) for j, n in enumerate(s)
                        if n == shape[i] and len(s) + rank - 2 <= 4 and len(s) + rank - 2 >= 1
                        and not (fam == "float" and huge[b])]
            if partners:
                b, j = draw(st.sampled_from(partners))
                new_shape = tuple(n for d, n in enumerate(shape) if d != i) + \
                    tuple(n for d, n in enumerate(shapes[b]) if d != j)
                op = ("dot", idx, b, i, j)
        elif kind == "concat":
            axis = draw(st.integers(0, rank - 1))
            partners = [b for b, s in enumerate(shapes)
                        if len(s) == rank and all(s[d] == shape[d] for d in range(rank) if d != axis)]
            b = draw(st.sampled_from(partners))
            new_shape = tuple(n + shapes[b][d] if d == axis else n for d, n in enumerate(shape))
            op = ("concat", idx, b, axis)
        elif kind == "slice":
            axis = draw(st.integers(0, rank - 1))
            n = shape[axis]
            if n:
                start = draw(st.integers(0, n - 1))
                stop = draw(st.integers(start, n))  # start == stop: an empty result
                step = draw(st.sampled_from([1, 1, 2, 3]))
                op = ("slice", idx, axis, start, stop, step)
                new_shape = tuple(len(range(start, stop, step)) if d == axis else s for d, s in enumerate(shape))
        elif kind in ("cumsum", "cummax"):
            op = (kind, idx, draw(st.integers(0, rank - 1)), draw(st.booleans()))
            new_shape = shape
        elif kind == "softmax":
            op, new_shape = ("softmax", idx, draw(st.integers(0, rank - 1))), shape
        elif kind == "sort":
            op, new_shape = ("sort", idx, draw(st.integers(0, rank - 1))), shape
        elif kind == "argmax":
            src = draw(st.integers(0, n_in - 1)) if fam == "float" else idx
            if len(shapes[src]) >= 2:
                axis = draw(st.integers(0, len(shapes[src]) - 1))
                if shapes[src][axis]:
                    op, new_shape = ("argmax", src, axis), tuple(n for d, n in enumerate(shapes[src]) if d != axis)
        elif kind == "take":
            axis = draw(st.integers(0, rank - 1))
            if shape[axis]:
                ids = tuple(draw(st.lists(st.integers(0, shape[axis] - 1), min_size=1, max_size=6)))
                op, new_shape = ("take", idx, axis, ids), tuple(len(ids) if d == axis else n for d, n in enumerate(shape))
        elif kind == "annotate":
            op, new_shape = ("annotate", idx, draw(spec_for(mesh, rank, sub_axes=True))), shape
        elif kind == "annotate_chain":  # two layouts in a row (replicate then shard, shard then move)
            idx = add(("annotate", idx, draw(spec_for(mesh, rank, sub_axes=True))), shape)
            op, new_shape = ("annotate", idx, draw(spec_for(mesh, rank, sub_axes=True))), shape
        elif kind == "partial_chain" and rank >= 2 and fam != "bool":
            # a sum over a (likely sharded) dim, kept partial through an annotation chain
            if fam == "float" and huge[idx]:
                idx = add(("unary", "tame", idx), shape)
            d = draw(st.integers(0, rank - 1))
            new_shape = tuple(n for i, n in enumerate(shape) if i != d)
            idx = add(("reduce", "sum", idx, (d,), False), new_shape)
            idx = add(("annotate", idx, draw(spec_for(mesh, rank - 1, sub_axes=True))), new_shape)
            op = ("annotate", idx, draw(spec_for(mesh, rank - 1, sub_axes=True)))
        elif kind == "scan":  # a loop with a sharded carry and a sharded constant
            same = [i for i, s in enumerate(shapes) if s == shape]
            name = draw(st.sampled_from(sorted(binary_ops(dtype))))
            length = draw(st.integers(1, 3))
            spec = draw(st.one_of(st.none(), spec_for(mesh, rank, sub_axes=True)))
            ys = draw(st.booleans()) and rank < 4
            op = ("scan", name, idx, draw(st.sampled_from(same)), length, spec, ys)
            new_shape = (length,) + shape if ys else shape
        if op is None or not new_shape or math.prod(new_shape) > MAX_ELEMS:
            continue
        add(op, new_shape)
    n_vals = len(shapes)
    outs = [n_vals - 1]
    if n_vals - 2 >= n_in and draw(st.booleans()):
        outs.insert(0, draw(st.integers(n_in, n_vals - 2)))
    out_specs = tuple(draw(st.one_of(st.none(), spec_for(mesh, len(shapes[o])))) if
                      draw(st.integers(0, 2)) == 0 else None for o in outs)
    return Program(mi, tuple(inputs), tuple(ops), tuple(outs), out_specs, dtype)


# -- running and comparing ----------------------------------------------------------------------------

STATS: Counter = Counter()
MISMATCHES: list = []


def check_program(prog: Program) -> list[str]:
    """Run ``prog`` partitioned and unpartitioned; the list of differences (empty: equal)."""
    mesh = mesh_of(prog.mesh)
    args = prog.args()
    ref_all = jax.jit(prog.all_values)(*args)
    f = gp.spmd(prog, mesh, in_shardings=tuple(inp[1] for inp in prog.inputs), out_shardings=prog.out_specs)
    got = f(*args)
    plan = f.plan(*args)
    info = _analyze(prog)
    dt = np_dtype(prog.dtype)
    tol = TOL.get(prog.dtype, 0) * float(jnp.finfo(dt).eps) if family(prog.dtype) == "float" else 0.0
    problems = []
    for i, (o, g) in enumerate(zip(prog.outputs, got)):
        exactness, _, deps = info[o]
        finite = [np.abs(np.asarray(ref_all[d], np.float64)) for d in sorted(deps) if not info[d][1]]
        finite = [a[np.isfinite(a)] for a in finite]
        scale = max([1.0] + [float(a.max()) for a in finite if a.size])
        diff, worst = fuzz_diff(g, ref_all[o], exactness, tol, scale)
        # the worst float error seen, in millionths of the tolerance
        STATS[(prog.dtype, "worst_err_ppm_of_tol")] = max(STATS[(prog.dtype, "worst_err_ppm_of_tol")], int(worst * 1e6))
        if diff:
            problems.append(f"output {i} ({['inexact', 'exact up to the sign of zero', 'exact'][exactness]}): {diff}")
        want_sharding = jax.sharding.NamedSharding(plan.jax_mesh, plan.out_specs[i])
        if not g.sharding.is_equivalent_to(want_sharding, g.ndim):
            problems.append(f"output {i}: laid out {g.sharding}, planned {want_sharding}")
    problems += report_problems(plan)
    return problems


def _run(prog: Program):
    STATS[(prog.dtype, "programs")] += 1
    STATS[(prog.dtype, "mismatches")] += 0
    modes = {inp[2] if len(inp) > 2 else "plain" for inp in prog.inputs}
    STATS[(prog.dtype, "special values")] += bool(modes - {"plain"})
    STATS[(prog.dtype, "empty values")] += any(0 in s for s in [inp[0] for inp in prog.inputs])
    STATS[(prog.dtype, "loops")] += any(op[0] == "scan" for op in prog.ops)
    STATS[(prog.dtype, "annotation chains")] += any(a[0] == b[0] == "annotate" and b[1] == len(prog.inputs) + i
                                                   for i, (a, b) in enumerate(zip(prog.ops, prog.ops[1:])))
    try:
        problems = check_program(prog)
    except Exception as e:  # noqa: BLE001 - a crash is a mismatch too
        if not os.environ.get("GSPMD_PY_FUZZ_KEEP_GOING"):
            raise
        problems = [f"raised {type(e).__name__}: {str(e)[:300]}"]
    if problems:
        STATS[(prog.dtype, "mismatches")] += 1
        MISMATCHES.append({"program": repr(prog), "problems": problems})
        if not os.environ.get("GSPMD_PY_FUZZ_KEEP_GOING"):
            raise AssertionError("; ".join(problems))


@pytest.fixture(scope="module", autouse=True)
def _fuzz_report():
    yield
    path = os.environ.get("GSPMD_PY_FUZZ_REPORT")
    if path:
        per = {}
        for (dt, what), n in sorted(STATS.items()):
            per.setdefault(dt, {})[what] = n
        with open(path, "w") as fh:
            json.dump({"per_dtype": per, "mismatches": MISMATCHES}, fh, indent=1)


@pytest.mark.slow
@examples(25)
@given(programs())
def test_random_programs(prog):
    _run(prog)


@pytest.mark.slow
def test_random_program_examples():
    """A few hand-picked programs of the kind the strategy draws (kept as regressions)."""
    progs = [
        Program(1, (((7, 13), gp.P("x", "y")), ((13,), None)),
                (("bcast_binary", "add", 0, 1, (0,)), ("reduce", "sum", 2, (0,), False), ("cumsum", 3, 0, True)),
                (4,), (None,)),
        Program(3, (((6, 5), gp.P(("x", "y"), "z")),),
                (("reshape", 0, (30,)), ("annotate", 1, gp.P("y")), ("unary", "tanh", 2), ("reshape", 3, (5, 6))),
                (4,), (gp.P(None, "x"),)),
        Program(2, (((12, 8), gp.P("y", "x")), ((8, 5), gp.P("x", None))),
                (("dot", 0, 1, 1, 0), ("softmax", 2, 1), ("transpose", 3, (1, 0))), (4,), (None,)),
        # a collective-permute over axes named out of mesh order (ppermute counts in mesh order)
        Program(0, (((1,), None),), (("concat", 0, 0, 0), ("unary", "abs", 1), ("unary", "abs", 2),
                                     ("annotate", 3, gp.P(("x:(2)4", "x:(1)2")))), (4,), (None,)),
        Program(1, (((1, 1), None),), (("unary", "abs", 0), ("concat", 1, 0, 1), ("unary", "abs", 2)),
                (3,), (gp.P(None, ("y", "x")),)),
    ]
    for p in progs:
        _run(p)
