"""Random small programs: the project's own fuzzer, as a strategy (``gpt.programs()``).

3-8 ops over random, often uneven, sometimes empty shapes, random input shardings and
gp.annotate at random points (single, or chains of two layouts, after a sum kept partial too),
loops (lax.scan) with sharded carries and constants, on ``gpt.meshes()``, in every dtype users
bring (float32, bfloat16, float16, int32, int8, bool) and with the values that break
partitioners (0, -0.0, +-inf, NaN, the smallest normal, values near the dtype's max, drawn
only where no accumulation of them happens: a sum of such a value first clips it, "tame").

    gpt.assert_spmd_equivalent(gpt.programs(), max_examples=200)   # a drawn Program brings its mesh and args

``analyze(prog)`` says per value how exactly it must match (EXACT, EXACT_UP_TO_ZERO_SIGN,
INEXACT) and which values it was computed from (the float tolerance's scale).
"""
from __future__ import annotations

import math
from typing import Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

from ..frontend.annotate import annotate
from ..core.mesh import Mesh
from .compare import EXACT, EXACT_UP_TO_ZERO_SIGN, INEXACT
from .strategies import fill, meshes, shardings

DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 0)
MAX_ELEMS = 4096
FUZZ_DTYPES = ("float32", "bfloat16", "float16", "int32", "int8", "bool")

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
VALUE_MODES = ("plain", "special", "near_max")


@attrs.frozen
class Program:
    """A random program: ``inputs`` ((shape, spec, value mode), ...), ``ops`` (("kind", args...), ...;
    each makes one new value), ``outputs`` (value indices) on the mesh ``mesh`` (shape, names,
    device ids), with ``out_specs`` and one ``dtype``. Callable (the program on its arguments); ``args()`` its arguments; ``gpt_case()``
    what gpt.assert_spmd_equivalent runs; its repr rebuilds it (``gpt.Program(...)``)."""

    mesh: tuple  # (shape, axis names, device ids)
    inputs: tuple  # ((shape, spec, value mode), ...)
    ops: tuple
    outputs: tuple
    out_specs: tuple
    dtype: str = "float32"

    @property
    def gpt_name(self) -> str:
        """The name gp.testing's messages give it."""
        return f"program_of_{len(self.ops)}_ops"

    def __call__(self, *args):
        env = self.all_values(*args)
        return tuple(env[i] for i in self.outputs)

    def all_values(self, *args):
        """Every value of the program on ``args`` (the inputs, then one per op), unpartitioned."""
        env = list(args)
        for op in self.ops:
            env.append(_apply(op, env, self.dtype))
        return env

    def gp_mesh(self) -> Mesh:
        """The program's mesh as a gp.Mesh (its shape, names and device ids)."""
        shape, names, ids = self.mesh
        return Mesh(shape, names, devices=list(ids))

    def args(self):
        """The program's example arguments (numpy arrays of the inputs' shapes, dtype and value modes)."""
        return tuple(fill(inp[0], np_dtype(self.dtype), i, inp[2] if len(inp) > 2 else "plain")
                     for i, inp in enumerate(self.inputs))

    def in_specs(self) -> tuple:
        """One input spec per argument, as ``in_shardings``."""
        return tuple(inp[1] for inp in self.inputs)

    def gpt_case(self):
        """(mesh, args, in_specs): what gpt.assert_spmd_equivalent checks for this program."""
        return self.gp_mesh(), self.args(), self.in_specs()

    def gpt_source(self) -> str:
        """Python source that rebuilds the program (reproducer scripts import it)."""
        return f"from gspmd_py.testing import Program\nfrom gspmd_py import P\nfn = {self!r}\n"


def np_dtype(name: str) -> np.dtype:
    return np.dtype(jnp.bfloat16) if name == "bfloat16" else np.dtype(name)


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
        return annotate(env[op[1]], op[2])
    if kind == "scan":  # a loop: carry a, constant b, `length` steps of carry = a op b (annotated)
        _, name, a, b, length, spec, ys = op
        f = binary_ops(dtype)[name]

        def body(c, _):
            c = f(c, env[b])
            c = c if spec is None else annotate(c, spec)
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


def analyze(prog: Program):
    """Per value: (exactness, holds values near the dtype's max, indices it was computed from)."""
    info = [(EXACT, len(inp) > 2 and inp[2] == "near_max", frozenset([i])) for i, inp in enumerate(prog.inputs)]
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
def programs(draw, mesh_strategy=None, dtypes: Sequence[str] = FUZZ_DTYPES, values: Sequence[str] = VALUE_MODES):
    """Random small programs (module doc) on meshes from ``mesh_strategy`` (default gpt.meshes()),
    in ``dtypes``, with inputs' values of the modes ``values`` (of "plain", "special", "near_max")."""
    mesh = draw(mesh_strategy if mesh_strategy is not None else meshes())
    dtype = draw(st.sampled_from(tuple(dtypes)))
    fam = family(dtype)
    n_in = draw(st.integers(*N_INPUTS))
    inputs = []
    shapes = []
    huge = []
    for _ in range(n_in):
        shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3)))
        spec = draw(st.one_of(st.none(), shardings(shape, mesh)))
        mode = draw(st.sampled_from(tuple(values) if fam != "bool" else ("plain",)))
        inputs.append((shape, spec, mode))
        shapes.append(shape)
        huge.append(mode == "near_max" and fam == "float")
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
            op, new_shape = ("annotate", idx, draw(shardings((0,) * rank, mesh))), shape
        elif kind == "annotate_chain":  # two layouts in a row (replicate then shard, shard then move)
            idx = add(("annotate", idx, draw(shardings((0,) * rank, mesh))), shape)
            op, new_shape = ("annotate", idx, draw(shardings((0,) * rank, mesh))), shape
        elif kind == "partial_chain" and rank >= 2 and fam != "bool":
            # a sum over a (likely sharded) dim, kept partial through an annotation chain
            if fam == "float" and huge[idx]:
                idx = add(("unary", "tame", idx), shape)
            d = draw(st.integers(0, rank - 1))
            new_shape = tuple(n for i, n in enumerate(shape) if i != d)
            idx = add(("reduce", "sum", idx, (d,), False), new_shape)
            idx = add(("annotate", idx, draw(shardings((0,) * (rank - 1), mesh))), new_shape)
            op = ("annotate", idx, draw(shardings((0,) * (rank - 1), mesh)))
        elif kind == "scan":  # a loop with a sharded carry and a sharded constant
            same = [i for i, s in enumerate(shapes) if s == shape]
            name = draw(st.sampled_from(sorted(binary_ops(dtype))))
            length = draw(st.integers(1, 3))
            spec = draw(st.one_of(st.none(), shardings((0,) * rank, mesh)))
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
    out_specs = tuple(draw(st.one_of(st.none(), shardings(shapes[o], mesh, sub_axes=False))) if
                      draw(st.integers(0, 2)) == 0 else None for o in outs)
    mesh_key = (mesh.shape, mesh.axis_names, tuple(mesh.device_ids.reshape(-1).tolist()))
    return Program(mesh_key, tuple(inputs), tuple(ops), tuple(outs), out_specs, dtype)
