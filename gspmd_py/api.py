"""The user-facing entry points: ``gp.spmd`` and the ``Plan`` it builds.

    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    plan = f.plan(x, w)       # trace -> propagate -> partition; runs nothing
    out = f(x, w)             # places inputs, runs the one SPMD program, global jax.Arrays out
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from .annotate import OPEN, annotate_p
from .errors import AnnotationError, ShardingError, SpecError
from .ir import Graph, Op, Value
from .mesh import AxisRef, Mesh
from .partitioner.context import Collective, Ctx
from .partitioner.fine_mesh import FineMesh
from .partitioner.program import boundary_out_dims, build_body, op_label, warn_fallbacks
from .partitioner.pvalue import ceil_div
from .propagation import Propagation, Seed
from .sharding import P, Sharding, spec_of
from .trace import trace

_SPEC_LEAF = (P, JP, NamedSharding, Sharding)


def _is_spec(x) -> bool:
    return x is None or isinstance(x, _SPEC_LEAF)


def _broadcast_specs(specs, tree, what: str) -> list:
    """One spec per leaf of ``tree``: ``specs`` is a spec (applies to the whole subtree) or a
    pytree prefix of ``tree`` whose leaves are specs, as jax.jit's in_shardings."""
    if _is_spec(specs):
        return [specs] * len(jax.tree_util.tree_leaves(tree))
    if isinstance(specs, (list, tuple)) and isinstance(tree, (list, tuple)) and not isinstance(specs, _SPEC_LEAF):
        if len(specs) != len(tree):
            raise SpecError(f"{what}: got {len(specs)} entries for {len(tree)} arguments/outputs")
        out = []
        for i, (s, t) in enumerate(zip(specs, tree)):
            out += _broadcast_specs(s, t, f"{what}[{i}]")
        return out
    if isinstance(specs, dict) and isinstance(tree, dict):
        if set(specs) != set(tree):
            raise SpecError(f"{what}: keys {sorted(specs)} do not match the argument's keys {sorted(tree)}")
        out = []
        for k in sorted(tree):
            out += _broadcast_specs(specs[k], tree[k], f"{what}[{k!r}]")
        return out
    raise SpecError(f"{what}: {specs!r} is not a spec (gp.P / PartitionSpec / None) nor a pytree prefix of the arguments")


def _dims_from_spec(mesh: Mesh, spec, rank: int, what: str) -> tuple[Optional[tuple[AxisRef, ...]], ...]:
    if isinstance(spec, Sharding):
        if spec.mesh != mesh:
            raise SpecError(f"{what}: sharding is over {spec.mesh}, not the function's mesh {mesh}")
        s = spec
    else:
        try:
            s = Sharding(mesh, spec, what=what)
        except SpecError as e:
            msg = str(e)
            raise SpecError(msg if msg.startswith(what) else f"{what}: {msg}") from None
    s = s.with_rank(rank, what)
    return tuple(s.dims)


def _annotation_dims(mesh: Mesh, spec: tuple, rank: int, what: str):
    out = []
    for d, e in enumerate(spec):
        if e == OPEN:
            out.append(None)
            continue
        try:
            out.append(tuple(mesh.ref(a) for a in e))
        except SpecError as err:
            raise SpecError(f"{what}, dim {d}: {err}") from None
    out += [()] * (rank - len(out))
    try:
        Sharding.of(mesh, [o or () for o in out])
    except SpecError as err:
        raise SpecError(f"{what}: {err}") from None
    return tuple(out)


def _aval(x, i: int):
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    if isinstance(x, (int, float, complex, bool, np.generic)):
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, jnp.asarray(x).dtype)
    raise AnnotationError(f"argument leaf {i} is {type(x).__name__}, not an array or jax.ShapeDtypeStruct")


class Plan:
    """Everything gspmd_py decided for one function and one set of input shapes."""

    def __init__(self, fn_name: str, mesh: Mesh, graph: Graph, prop: Propagation, in_tree, out_tree,
                 in_names: list[str]):
        self.fn_name, self.mesh, self.graph, self.prop = fn_name, mesh, graph, prop
        self._in_tree, self._out_tree, self._in_names = in_tree, out_tree, in_names
        self._shardings = {v.id: Sharding.of(mesh, prop.dims_of(v)) for v in graph.all_values()}
        refs = [a for s in self._shardings.values() for a in s.used_axes]
        self.fine = FineMesh.build(mesh, refs)
        self.ctx = Ctx(self.fine)
        self._build()

    # -- building -----------------------------------------------------------------
    def _fdims(self, v: Value):
        return self.fine.fine_dims(self._shardings[v.id].dims)

    def _build(self) -> None:
        g, ctx = self.graph, self.ctx
        in_dims = [self._fdims(v) for v in g.inputs]
        out_dims = [self._fdims(v) for v in g.outputs]
        want = {v.id: self._fdims(v) for v in g.all_values()}
        body = build_body(g, ctx, in_dims, out_dims, want)
        self.jax_mesh = self.fine.jax_mesh()
        spec = lambda dims: JP(*[tuple(d) if len(d) > 1 else (d[0] if d else None) for d in dims])
        self.in_specs = tuple(spec(d) for d in in_dims)
        self._out_fdims = [boundary_out_dims(ctx, v.shape, d) for v, d in zip(g.outputs, out_dims)]
        self.out_specs = tuple(spec(d) for d in self._out_fdims)
        self.padded_in_shapes = [tuple(ceil_div(n, ctx.k(a)) * ctx.k(a) if a else n for n, a in zip(v.shape, d))
                                 for v, d in zip(g.inputs, in_dims)]
        smap = jax.shard_map(body, mesh=self.jax_mesh, in_specs=self.in_specs, out_specs=self.out_specs,
                             check_vma=False)
        self._jitted = jax.jit(smap)
        avals = [jax.ShapeDtypeStruct(s, v.dtype) for s, v in zip(self.padded_in_shapes, g.inputs)]
        self._traced = self._jitted.trace(*avals)
        self._compiled = None
        warn_fallbacks(ctx)

    # -- queries --------------------------------------------------------------------
    def _value(self, name: str) -> Value:
        for v in self.graph.all_values():
            if v.name == name:
                return v
        if name in self._in_names:
            return self.graph.inputs[self._in_names.index(name)]
        if name.startswith("out") and name[3:].isdigit() and int(name[3:]) < len(self.graph.outputs):
            return self.graph.outputs[int(name[3:])]
        known = sorted({v.name for v in self.graph.values() if v.name} | set(self._in_names))
        raise ShardingError(f"no value named {name!r} in {self.fn_name}; named values: {known} (and out0, out1, ...)")

    def sharding_of(self, name: str) -> Sharding:
        return self._shardings[self._value(name).id]

    @property
    def in_shardings(self):
        return jax.tree_util.tree_unflatten(self._in_tree, [self._shardings[v.id] for v in self.graph.inputs])

    @property
    def out_shardings(self):
        return jax.tree_util.tree_unflatten(self._out_tree, [self._shardings[v.id] for v in self.graph.outputs])

    @property
    def collectives(self) -> list[Collective]:
        return list(self.ctx.collectives)

    @property
    def fallbacks(self):
        return list(self.ctx.fallbacks)

    def explain(self, name: str) -> str:
        return self.prop.explain(self._value(name), name)

    def spmd_text(self) -> str:
        """The per-device program (the body of the shard_map), as a jaxpr."""
        jaxpr = self._traced.jaxpr
        for eqn in jaxpr.eqns:
            inner = _find_shard_map(eqn)
            if inner is not None:
                return str(inner)
        return str(jaxpr)

    def lower_text(self) -> str:
        """StableHLO of the SPMD program (works on abstract meshes too)."""
        return self._traced.lower(lowering_platforms=("cpu",)).as_text()

    def report(self) -> str:
        ctx, lines = self.ctx, []
        lines.append(f"gspmd_py plan for {self.fn_name} on {self.mesh}"
                     + (f" (executed on {dict(zip(self.fine.names, self.fine.sizes))})"
                        if self.fine.names != self.mesh.axis_names else ""))
        by_op: dict[str, list[Collective]] = {}
        for c in ctx.collectives:
            by_op.setdefault(c.op, []).append(c)
        rows = [("op", "global", "sharding", "local", "collectives")]
        for i, v in enumerate(self.graph.inputs):
            s = self._shardings[v.id]
            rows.append((f"input {self._in_names[i]}", v.type_str, s.shardy(), _local(self, v), ""))
        def walk(graph, depth):
            for op in graph.ops:
                label = op_label(op)
                colls = "; ".join(f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device}B" for c in by_op.get(label, []))
                for v in op.outputs:
                    s = self._shardings[v.id]
                    nm = f" <{v.name}>" if v.name else ""
                    rows.append(("  " * depth + f"{op.prim} #{op.id}{nm}", v.type_str, s.shardy(), _local(self, v),
                                 colls))
                    colls = ""
                for r in op.regions:
                    walk(r, depth + 1)

        walk(self.graph, 0)
        for c in by_op.get("boundary", []):
            rows.append(("boundary", "", "", "", f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device}B"))
        widths = [min(max(len(r[i]) for r in rows), 48) for i in range(5)]
        for r in rows:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        total = sum(c.bytes_per_device for c in ctx.collectives)
        lines.append(f"collectives: {len(ctx.collectives)} ({_count(ctx.collectives)}), {total} bytes per device")
        for fb in ctx.fallbacks:
            lines.append(f"REPLICATED FALLBACK at {fb.op}: {fb.reason}")
        for note in ctx.notes:
            lines.append(f"note: {note}")
        for v, d, s in zip(self.graph.outputs, self._out_fdims, self.out_specs):
            if self._fdims(v) != d:
                lines.append(f"note: output %{v.id} {v.type_str} is uneven on {self._shardings[v.id].shardy()}; "
                             f"returned as {s} (jax.Arrays must divide evenly)")
        return "\n".join(lines)

    # -- execution --------------------------------------------------------------------
    def compiled(self):
        if self.mesh.is_abstract:
            raise ShardingError(f"{self.mesh} is abstract: it can be planned and lowered, not run")
        if self._compiled is None:
            self._compiled = self._traced.lower().compile()
        return self._compiled

    def place(self, leaves):
        out = []
        for x, v, shp, spec in zip(leaves, self.graph.inputs, self.padded_in_shapes, self.in_specs):
            target = NamedSharding(self.jax_mesh, spec)
            if isinstance(x, jax.Array) and tuple(x.shape) == shp and x.sharding.is_equivalent_to(target, x.ndim):
                out.append(x)
                continue
            if tuple(np.shape(x)) != shp:
                pads = [(0, p - n) for n, p in zip(np.shape(x), shp)]
                x = np.pad(np.asarray(x), pads) if not isinstance(x, jax.Array) else jnp.pad(x, pads)
            out.append(jax.device_put(jnp.asarray(x, dtype=v.dtype) if not isinstance(x, jax.Array) else x, target))
        return out

    def run(self, leaves):
        outs = self.compiled()(*self.place(leaves))
        return jax.tree_util.tree_unflatten(self._out_tree, list(outs))


def _find_shard_map(eqn):
    if eqn.primitive.name == "shard_map":
        return eqn.params["jaxpr"]
    for k in ("jaxpr", "call_jaxpr"):
        sub = eqn.params.get(k)
        if sub is not None:
            j = getattr(sub, "jaxpr", sub)
            for e in j.eqns:
                r = _find_shard_map(e)
                if r is not None:
                    return r
    return None


def _local(plan: Plan, v: Value) -> str:
    d = plan._fdims(v)
    shape = plan.ctx.local_shape(v.shape, d)
    return "[" + ",".join(str(s) for s in shape) + "]"


def _count(cs) -> str:
    kinds: dict[str, int] = {}
    for c in cs:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


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
        leaves, tree = jax.tree_util.tree_flatten(args)
        avals = [_aval(x, i) for i, x in enumerate(leaves)]
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
        return p.run(leaves)

    def _plan(self, args, in_tree, avals) -> Plan:
        mesh = self.mesh
        name = getattr(self.fn, "__name__", "fn")
        in_specs = _broadcast_specs(self.in_shardings, tuple(args), "in_shardings")
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tuple(args))[0]]
        in_names = [f"arg{p}" if p else "arg" for p in (pp.replace("[", "").replace("]", "").replace("'", "")
                                                        for pp in paths)]
        in_names = [n if len(avals) > 1 else "arg0" for n in in_names]
        out_tree_box = []

        def flat_fn(*leaves):
            a = jax.tree_util.tree_unflatten(in_tree, list(leaves))
            out = self.fn(*a)
            flat, t = jax.tree_util.tree_flatten(out)
            out_tree_box.append((t, out))
            return flat

        graph = trace(flat_fn, avals)
        out_tree, out_value = out_tree_box[-1]
        out_specs = _broadcast_specs(self.out_shardings, out_value if isinstance(out_value, (tuple, list, dict))
                                     else (out_value,), "out_shardings") if self.out_shardings is not None else \
            [None] * len(graph.outputs)
        if isinstance(self.out_shardings, _SPEC_LEAF) and not isinstance(out_value, (tuple, list, dict)):
            out_specs = [self.out_shardings]
        seeds: list[Seed] = []
        for i, (v, spec) in enumerate(zip(graph.inputs, in_specs)):
            v.name = v.name or in_names[i]
            if spec is not None:
                dims = _dims_from_spec(mesh, spec, v.rank, f"in_shardings for argument {in_names[i]} {v.type_str}")
                seeds.append(Seed(v, dims, 0, f"in_shardings of {in_names[i]}"))
        # distinct output values, so an output may be laid out unlike the value it returns
        for i, spec in enumerate(out_specs):
            v = graph.outputs[i]
            out = Value(_next_id(graph), v.shape, v.dtype, name=None)
            op = Op(_next_id(graph), "gspmd_annotate", [v], [out],
                    {"spec": (), "priority": 0, "unspecified": True}, annotate_p, source=f"output {i}")
            out.producer = op
            graph.ops.append(op)
            graph.outputs[i] = out
            if spec is not None:
                dims = _dims_from_spec(mesh, spec, v.rank, f"out_shardings for output {i} {v.type_str}")
                seeds.append(Seed(out, dims, 0, f"out_shardings of output {i}"))
        for op in graph.walk():
            if op.prim == "gspmd_annotate" and not op.params.get("unspecified"):
                v = op.outputs[0]
                what = f"gp.annotate at {op.source or 'op %d' % op.id} on {v.type_str}"
                dims = _annotation_dims(mesh, op.params["spec"], v.rank, what)
                seeds.append(Seed(v, dims, op.params["priority"], what))
        prop = Propagation(graph, mesh, seeds).run()
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
