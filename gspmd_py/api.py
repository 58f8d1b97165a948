"""The user-facing entry point ``gp.spmd``.

    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    plan = f.plan(x, w)       # trace -> propagate -> partition; runs nothing
    out = f(x, w)             # places inputs, runs the one SPMD program, global jax.Arrays out
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from .annotate import annotate_p
from .constraints import outside_user_mesh
from .errors import ShardingError
from .ir import Graph, Op, Value
from .mesh import Mesh
from .plan import Plan
from .plancheck import check_same_program
from .propagation import Propagation, Seed
from .specs import annotation_dims, arg_avals, leaf_names, spec_dims
from .trace import trace


class Spmd:
    """A function partitioned by gspmd_py (see ``spmd``)."""

    def __init__(self, fn: Callable, mesh: Mesh, in_shardings=None, out_shardings=None):
        if not isinstance(mesh, Mesh):
            raise ShardingError(f"gp.spmd needs a gp.Mesh, got {type(mesh).__name__}")
        self.fn, self.mesh = fn, mesh
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        self._plans: dict[Any, Plan] = {}
        functools.update_wrapper(self, fn)

    def _key(self, args):
        leaves, tree, avals = arg_avals(args)
        return (tree, tuple((a.shape, str(a.dtype)) for a in avals)), leaves, tree, avals

    def plan(self, *args) -> Plan:
        key, leaves, tree, avals = self._key(args)
        p = self._plans.get(key)
        if p is None:
            p = self._plan(args, tree, avals)
            self._plans[key] = p
        return p

    def __call__(self, *args):
        key, leaves, tree, avals = self._key(args)
        p = self._plans.get(key) or self.plan(*args)
        check_same_program(p)  # multi-process runs only: every process planned this program
        return p.run(leaves)

    def from_local(self, *local_args, global_shapes=None):
        """Call with each process's own block of every argument (multi-process runs; see
        ``gspmd_py/global_inputs.py``): an argument split across processes by its in_sharding
        is passed as the part this process's devices hold (``gp.distributed.local_slices``),
        any other argument whole.
        ``global_shapes`` (a shape or None per leaf) gives the global shapes that equal blocks
        cannot infer (uneven dims). Outputs are global jax.Arrays, as from ``f(...)``."""
        from .global_inputs import from_local

        return from_local(self, local_args, global_shapes)

    def _plan(self, args, in_tree, avals) -> Plan:
        mesh = self.mesh
        name = getattr(self.fn, "__name__", "fn")
        in_names = leaf_names(tuple(args))
        in_dims = spec_dims(mesh, self.in_shardings, tuple(args), [len(a.shape) for a in avals],
                            [Value(0, tuple(a.shape), a.dtype).type_str for a in avals], "in_shardings", in_names)
        out_tree_box = []

        def flat_fn(*leaves):
            a = jax.tree_util.tree_unflatten(in_tree, list(leaves))
            out = self.fn(*a)
            flat, t = jax.tree_util.tree_flatten(out)
            out_tree_box.append((t, out))
            return flat

        graph = trace(flat_fn, avals, mesh=mesh)
        out_tree, out_value = out_tree_box[-1]
        out_names = [f"out{i}" for i in range(len(graph.outputs))]
        out_dims = spec_dims(mesh, self.out_shardings, out_value, [v.rank for v in graph.outputs],
                             [v.type_str for v in graph.outputs], "out_shardings", out_names)
        seeds: list[Seed] = []
        for i, (v, dims) in enumerate(zip(graph.inputs, in_dims)):
            v.name = v.name or in_names[i]
            if dims is not None:
                seeds.append(Seed(v, dims, 0, f"in_shardings of {in_names[i]}"))
        # distinct output values, so an output may be laid out unlike the value it returns
        for i, dims in enumerate(out_dims):
            v = graph.outputs[i]
            out = Value(_next_id(graph), v.shape, v.dtype, name=None)
            op = Op(_next_id(graph), "gspmd_annotate", [v], [out],
                    {"spec": (), "priority": 0, "unspecified": True}, annotate_p, source=f"output {i}")
            out.producer = op
            graph.ops.append(op)
            graph.outputs[i] = out
            if dims is not None:
                seeds.append(Seed(out, dims, 0, f"out_shardings of output {i}"))
        for op in graph.walk():
            if op.prim == "gspmd_annotate" and not op.params.get("unspecified"):
                dims, what = annotation_dims(mesh, op, op.outputs[0].rank)
                seeds.append(Seed(op.outputs[0], dims, op.params["priority"], what))
        prop = Propagation(graph, mesh, seeds).run()
        with outside_user_mesh():
            return Plan(name, mesh, graph, prop, in_tree, out_tree, in_names)


def _next_id(graph: Graph) -> int:
    m = max([v.id for v in graph.values()] + [op.id for op in graph.walk()] + [-1])
    return m + 1


def spmd(fn: Callable | None = None, mesh: Mesh | None = None, *, in_shardings=None, out_shardings=None):
    """Partition ``fn`` over ``mesh``; usable as ``gp.spmd(fn, mesh, ...)`` or ``@gp.spmd(mesh=mesh, ...)``."""
    if fn is not None and not callable(fn):
        if isinstance(fn, Mesh) and mesh is None:
            fn, mesh = None, fn
        else:
            raise ShardingError(f"gp.spmd: first argument must be the function, got {type(fn).__name__}")
    if mesh is None:
        raise ShardingError("gp.spmd needs mesh=gp.Mesh(...)")
    if fn is None:
        return lambda f: Spmd(f, mesh, in_shardings, out_shardings)
    return Spmd(fn, mesh, in_shardings, out_shardings)
