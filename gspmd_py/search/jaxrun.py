"""``res.jax_shardings()``: an auto_shard plan run by ``jax.jit``'s own partitioner.

The plan said in JAX's terms: a NamedSharding per input and output (pytrees like the
arguments and results), and the search's intermediate annotations as constraints, each
``(what, NamedSharding)``. ``fn`` is the traced program with those constraints in
(``jax.lax.with_sharding_constraint`` after each annotated result), so::

    js = res.jax_shardings()
    out = jax.jit(js.fn, in_shardings=js.in_shardings, out_shardings=js.out_shardings)(*args)
    out = js.jit()(*args)       # the same

runs the plan under XLA's partitioner (GSPMD / Shardy) instead of gspmd_py's. A dim whose
size the mesh axes do not divide is left unsharded at the boundary (a jax.Array must divide
evenly); constraints keep the plan's sharding (XLA pads).
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from ..core.ir import Graph
from ..core.mesh import Mesh


@attrs.frozen
class JaxShardings:
    """See the module docstring."""

    in_shardings: Any
    out_shardings: Any
    constraints: tuple[tuple[str, NamedSharding], ...]
    fn: Callable = attrs.field(repr=False, eq=False)

    def jit(self, **kw) -> Callable:
        return jax.jit(self.fn, in_shardings=self.in_shardings, out_shardings=self.out_shardings, **kw)


def _spec(mesh: Mesh, dims, shape, even: bool) -> JP:
    entries = []
    for n, axes in zip(shape, dims):
        names = [a.name for a in axes if a.whole]
        k = 1
        for a in axes:
            k *= a.size
        if not names or len(names) != len(axes) or (even and n % k):
            entries.append(None)
        else:
            entries.append(names[0] if len(names) == 1 else tuple(names))
    return JP(*entries)


def run_graph(graph: Graph, constraints: dict) -> Callable:
    """A function of the graph's flat inputs that evaluates it, op by op (each op's JAX
    primitive bound again), with ``with_sharding_constraint`` on the values in ``constraints``
    (value id -> NamedSharding)."""

    def fn(*flat):
        env = {v.id: x for v, x in zip(graph.inputs, flat)}

        def read(v):
            return v.const if v.is_const else env[v.id]

        for op in graph.ops:
            outs = op.primitive.bind(*[read(v) for v in op.inputs], **op.params)
            outs = outs if op.primitive.multiple_results else [outs]
            for v, x in zip(op.outputs, outs):
                if v.id in constraints:
                    x = jax.lax.with_sharding_constraint(x, constraints[v.id])
                env[v.id] = x
        return [read(v) for v in graph.outputs]

    return fn


def jax_shardings(plan, decided_ids) -> JaxShardings:
    """``plan`` in JAX's terms; ``decided_ids``: the values the search annotated."""
    mesh = plan.mesh
    jmesh = jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names)

    def named(v, even: bool) -> NamedSharding:
        return NamedSharding(jmesh, _spec(mesh, plan.prop.dims_of(v), v.shape, even))

    g = plan.graph
    top = {v.id: v for op in g.ops for v in op.outputs}
    cons = {vid: named(top[vid], False) for vid in decided_ids if vid in top}
    ins = jax.tree_util.tree_unflatten(plan.in_tree, [named(v, True) for v in g.inputs])
    outs = jax.tree_util.tree_unflatten(plan.out_tree, [named(v, True) for v in g.outputs])
    flat_fn = run_graph(g, cons)

    def fn(*args):
        leaves = jax.tree_util.tree_leaves(args)
        return jax.tree_util.tree_unflatten(plan.out_tree, flat_fn(*leaves))

    labels = {v.id: _label(v) for op in g.ops for v in op.outputs}
    return JaxShardings(ins, outs, tuple((labels[vid], s) for vid, s in sorted(cons.items())), fn)


def _label(v) -> str:
    p = v.producer
    return f"%{v.id} {v.type_str} ({p.prim}{' at ' + p.source if p.source else ''})"
