"""Random small programs (3-8 ops over random, often uneven shapes) with random input
shardings and gp.annotate at random points, on the four 8-device meshes: the
partitioned result always equals the unpartitioned one."""
from __future__ import annotations

import math

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import MESH_SHAPES, assert_same, examples, mesh_of, rand, spec_for

DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16)
MAX_ELEMS = 4096

UNARY = {
    "tanh": jnp.tanh, "exp": lambda v: jnp.exp(jnp.clip(v, -5, 5)), "neg": jnp.negative, "abs": jnp.abs,
    "sin": jnp.sin, "square": lambda v: v * v, "relu": jax.nn.relu, "scale": lambda v: v * 0.5 + 1.0,
    "floor_cvt": lambda v: jnp.floor(v).astype(jnp.int32).astype(jnp.float32),
}
BINARY = {
    "add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "max": jnp.maximum, "min": jnp.minimum,
    "select": lambda a, b: jnp.where(a > b, a - b, 0.0), "div": lambda a, b: a / (1.0 + jnp.abs(b)),
}
# Ops are continuous in their inputs (the partitioned program rounds differently from the
# op-by-op reference); discontinuous ones (argmax, floor) only read program inputs.
EXACT_ONLY = {"floor_cvt"}


# drawn uniformly: binary and annotate twice as often as the others
OP_KINDS = ("unary", "binary", "binary", "transpose", "reshape", "broadcast", "reduce", "dot", "concat", "slice",
            "cumsum", "softmax", "sort", "argmax", "take", "annotate", "annotate")
N_OPS = (3, 8)
N_INPUTS = (1, 2)


@attrs.frozen
class Program:
    mesh: int
    inputs: tuple  # ((shape, spec), ...)
    ops: tuple  # (("kind", args...), ...); each op makes one new value
    outputs: tuple  # value indices
    out_specs: tuple

    def __call__(self, *args):
        env = list(args)
        for op in self.ops:
            env.append(_apply(op, env))
        return tuple(env[i] for i in self.outputs)


def _apply(op, env):
    kind = op[0]
    if kind == "unary":
        return UNARY[op[1]](env[op[2]])
    if kind == "binary":
        return BINARY[op[1]](env[op[2]], env[op[3]])
    if kind == "bcast_binary":  # a (bigger) op b, b broadcast along the dims it lacks
        _, name, a, b, dims = op
        return BINARY[name](env[a], jnp.expand_dims(env[b], dims))
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
        f = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}[name]
        return f(env[a], axis=axes, keepdims=keep)
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
    if kind == "softmax":
        return jax.nn.softmax(env[op[1]], axis=op[2])
    if kind == "sort":
        return jnp.sort(env[op[1]], axis=op[2])
    if kind == "argmax":
        return jnp.argmax(env[op[1]], axis=op[2]).astype(jnp.float32)
    if kind == "take":
        _, a, axis, idx = op
        return jnp.take(env[a], np.asarray(idx, np.int32), axis=axis)
    if kind == "annotate":
        return gp.annotate(env[op[1]], op[2])
    raise ValueError(kind)


def _factorizations(n):
    return [(d, n // d) for d in range(2, n) if n % d == 0]


@st.composite
def programs(draw):
    mi = draw(st.integers(0, len(MESH_SHAPES) - 1))
    mesh = mesh_of(mi)
    n_in = draw(st.integers(*N_INPUTS))
    inputs = []
    shapes = []
    for _ in range(n_in):
        shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=3)))
        spec = draw(st.one_of(st.none(), spec_for(mesh, len(shape), sub_axes=True)))
        inputs.append((shape, spec))
        shapes.append(shape)
    ops = []
    count = draw(st.integers(*N_OPS))
    for _ in range(count):
        # mostly chain on the latest values, so programs are deep rather than wide
        idx = len(shapes) - 1 - min(draw(st.integers(0, len(shapes) - 1)), draw(st.integers(0, 2)))
        shape = shapes[idx]
        rank = len(shape)
        kind = draw(st.sampled_from(OP_KINDS))
        op = None
        new_shape = None
        if kind == "unary":
            names = sorted(UNARY) if idx < n_in else sorted(set(UNARY) - EXACT_ONLY)
            op, new_shape = ("unary", draw(st.sampled_from(names)), idx), shape
        elif kind == "binary":
            same = [i for i, s in enumerate(shapes) if s == shape]
            lower = [i for i, s in enumerate(shapes) if 0 < len(s) < rank and s == shape[rank - len(s):]]
            name = draw(st.sampled_from(sorted(BINARY)))
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
            name = draw(st.sampled_from(["sum", "max", "min"]))
            op = ("reduce", name, idx, axes, keep)
            new_shape = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keep else \
                tuple(n for d, n in enumerate(shape) if d not in axes)
        elif kind == "dot":
            i = draw(st.integers(0, rank - 1))
            partners = [(b, j) for b, s in enumerate(shapes) for j, n in enumerate(s)
                        if n == shape[i] and len(s) + rank - 2 <= 4 and len(s) + rank - 2 >= 1]
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
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            step = draw(st.sampled_from([1, 1, 2, 3]))
            op = ("slice", idx, axis, start, stop, step)
            new_shape = tuple(len(range(start, stop, step)) if d == axis else s for d, s in enumerate(shape))
        elif kind == "cumsum":
            op = ("cumsum", idx, draw(st.integers(0, rank - 1)), draw(st.booleans()))
            new_shape = shape
        elif kind == "softmax":
            op, new_shape = ("softmax", idx, draw(st.integers(0, rank - 1))), shape
        elif kind == "sort":
            op, new_shape = ("sort", idx, draw(st.integers(0, rank - 1))), shape
        elif kind == "argmax":
            src = draw(st.integers(0, n_in - 1))
            if len(shapes[src]) >= 2:
                axis = draw(st.integers(0, len(shapes[src]) - 1))
                op, new_shape = ("argmax", src, axis), tuple(n for d, n in enumerate(shapes[src]) if d != axis)
        elif kind == "take":
            axis = draw(st.integers(0, rank - 1))
            ids = tuple(draw(st.lists(st.integers(0, shape[axis] - 1), min_size=1, max_size=6)))
            op, new_shape = ("take", idx, axis, ids), tuple(len(ids) if d == axis else n for d, n in enumerate(shape))
        elif kind == "annotate":
            op, new_shape = ("annotate", idx, draw(spec_for(mesh, rank, sub_axes=True))), shape
        if op is None or not new_shape or math.prod(new_shape) > MAX_ELEMS:
            continue
        ops.append(op)
        shapes.append(new_shape)
    n_vals = len(shapes)
    outs = [n_vals - 1]
    if n_vals - 2 >= n_in and draw(st.booleans()):
        outs.insert(0, draw(st.integers(n_in, n_vals - 2)))
    out_specs = tuple(draw(st.one_of(st.none(), spec_for(mesh, len(shapes[o])))) if
                      draw(st.integers(0, 2)) == 0 else None for o in outs)
    return Program(mi, tuple(inputs), tuple(ops), tuple(outs), out_specs)


def _run(prog: Program):
    mesh = mesh_of(prog.mesh)
    args = tuple(rand(shape, seed=i) for i, (shape, _) in enumerate(prog.inputs))
    want = prog(*args)
    f = gp.spmd(prog, mesh, in_shardings=tuple(s for _, s in prog.inputs), out_shardings=prog.out_specs)
    got = f(*args)
    assert_same(got, want, rtol=1e-4, atol=1e-4)
    plan = f.plan(*args)
    for i, o in enumerate(got):
        assert o.sharding.is_equivalent_to(jax.sharding.NamedSharding(plan.jax_mesh, plan.out_specs[i]), o.ndim)


@examples(25)
@given(programs())
def test_random_programs(prog):
    _run(prog)


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
