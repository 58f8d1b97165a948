"""Trace a JAX function into gspmd_py's IR.

``trace(fn, avals)`` runs ``jax.make_jaxpr`` and converts the jaxpr (``trace_jaxpr``):
nested calls (jit/pjit, closed_call, remat/checkpoint, custom_jvp_call, custom_vjp_call,
and other gp.spmd functions' ``spmd_call``) are inlined; scan/while/cond stay region ops
whose bodies are nested Graphs; literals and closed-over arrays become constant Values.

An inlined gp.spmd function (``spmd_call``) brings its in/out shardings along as
``gp.annotate`` ops around its body (from the call's parameters: its jaxpr is the user's
function as written), so they become annotations of the outer program; its mesh must be
the outer function's.

``output_ports`` (the compiler's trace pass): each output of the program gets a value of
its own, its port: an unspecified ``gp.annotate`` (an identity that constrains nothing) of
the value it returns, so an output may be laid out unlike that value (an input returned as
is, one value returned twice under two out_shardings, a constant returned).

The recomputation of a differentiated ``jax.checkpoint`` region stays a recomputation:
its inputs pass through an optimization barrier first (per input, an elementwise
identity the partitioner keeps local), as JAX's own lowering of ``checkpoint`` does, so
XLA cannot merge it with the forward pass and the memory saving survives.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from .annotate import annotate_p, spec_entries
from .constraints import CONSTRAINTS, as_annotation, tracing_mesh
from ..dtypes import is_key
from ..errors import ShardingError
from . import shifts
from ..ir import Graph, IdGen, Op, Value, eliminate_dead_code, new_value

INLINE = {"jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "name", "named_call", "spmd_call"}
REMAT = {"remat", "remat2", "checkpoint"}
BARRIER = "optimization_barrier_elementwise"  # one operand, one result: an elementwise identity
REGION = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _source(eqn) -> str:
    try:
        from jax._src import source_info_util

        return source_info_util.summarize(eqn.source_info)
    except Exception:  # pragma: no cover - best effort only
        return ""


def _open(j):
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


class _Builder:
    def __init__(self, ids: IdGen, mesh=None):
        self.ids = ids
        self.mesh = mesh  # the outer gp.spmd function's mesh: inlined gp.spmd calls must use it

    def const(self, data, dtype=None) -> Value:
        """A constant Value; ``dtype`` is the jaxpr's type for it (a Python scalar literal is
        weakly typed: ``int8_array * 3`` multiplies by an int8 3, not an int32 one)."""
        if is_key(getattr(data, "dtype", None)):  # a typed PRNG key (no NumPy form): kept as the jax array
            return new_value(self.ids, tuple(data.shape), data.dtype, const=data)
        arr = np.asarray(data)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            arr = np.asarray(data, dtype=dtype)
        return new_value(self.ids, arr.shape, arr.dtype, const=arr)

    def convert(self, jaxpr, consts: Sequence[Any], inputs: Sequence[Value] | None = None,
                scope: tuple[str, ...] = (), where: str = "", ports: bool = False) -> Graph:
        """The Graph of ``jaxpr``; ``ports``: each output a value of its own (see the module doc)."""
        env: dict[Any, Value] = {}
        ops: list[Op] = []
        if inputs is None:
            inputs = [new_value(self.ids, v.aval.shape, v.aval.dtype) for v in jaxpr.invars]
        for var, val in zip(jaxpr.invars, inputs):
            env[var] = val
        for var, c in zip(jaxpr.constvars, consts):
            env[var] = self.const(c, var.aval.dtype)
        self._eqns(jaxpr.eqns, env, ops, scope, where)
        outs = [self._read(env, v) for v in jaxpr.outvars]
        if ports:
            outs = [self.annotate(v, None, ops, "") for v in outs]
        return Graph(list(inputs), outs, ops)

    def annotate(self, v: Value, dims, ops: list[Op], source: str, scope: str = "") -> Value:
        """``v`` through a new ``gp.annotate`` op of canonical ``dims`` (None: unspecified, an
        identity that constrains nothing), appended to ``ops``."""
        out = new_value(self.ids, v.shape, v.dtype)
        params = ({"spec": (), "priority": 0, "unspecified": True} if dims is None else
                  {"spec": spec_entries(dims), "priority": 0, "unspecified": False})
        op = Op(self.ids(), annotate_p.name, [v], [out], params, annotate_p, source=source, scope=scope)
        out.producer = op
        ops.append(op)
        return out

    def _read(self, env, var) -> Value:
        if hasattr(var, "val") and not hasattr(var, "suffix") and type(var).__name__ == "Literal":
            return self.const(var.val, var.aval.dtype)
        return env[var]

    def _eqns(self, eqns, env, ops: list[Op], scope: tuple[str, ...] = (), where: str = "") -> None:
        """``scope``: the names of the calls inlined around these equations (``jnp.searchsorted``
        is ``jit[name=searchsorted]``); ``where``: the source line of the call around them, for
        equations whose own source is lost (inside a library's scan body)."""
        for eqn in eqns:
            name = eqn.primitive.name
            ins = [self._read(env, v) for v in eqn.invars]
            sub = next((eqn.params[k] for k in _CALL_PARAMS if k in eqn.params and eqn.params[k] is not None), None)
            src = _source(eqn) or where
            if name in INLINE and sub is not None:
                if name == "spmd_call":
                    self._check_mesh(eqn)
                    ins = self._call_inputs(eqn, ins, ops, "/".join(scope), src)
                if name in REMAT:
                    ins = self._barrier(eqn, ins, ops)
                inner, consts = _open(sub)
                n_extra = len(inner.invars) - len(ins)
                if n_extra:  # custom_vjp_call may pass fewer args than the call jaxpr's invars
                    ins = ins[-len(inner.invars):] if n_extra < 0 else ins
                local = dict(zip(inner.invars, ins))
                for var, c in zip(inner.constvars, consts):
                    local[var] = self.const(c, var.aval.dtype)
                named = scope + (str(eqn.params["name"]),) if eqn.params.get("name") else scope
                self._eqns(inner.eqns, local, ops, named, src)
                outs = [self._read(local, iv) for iv in inner.outvars]
                if name == "spmd_call":
                    outs = self._call_outputs(eqn, outs, ops, "/".join(scope), src)
                for ov, o in zip(eqn.outvars, outs):
                    env[ov] = o
                continue
            outs = [new_value(self.ids, v.aval.shape, v.aval.dtype) for v in eqn.outvars]
            op = Op(self.ids(), name, ins, outs, dict(eqn.params), eqn.primitive, source=src, scope="/".join(scope),
                    effects=bool(eqn.effects))
            for o in outs:
                o.producer = op
            if name in REGION:
                for key in REGION[name]:
                    subs = eqn.params[key]
                    for s in subs if isinstance(subs, (tuple, list)) else (subs,):
                        j, consts = _open(s)
                        op.regions.append(self.convert(j, consts, scope=scope, where=src))
            if name == "gspmd_tag":
                outs[0].name = eqn.params["name"]
            if name in CONSTRAINTS:  # jax.lax.with_sharding_constraint / reshard: an annotation
                as_annotation(op)
            ops.append(op)
            for var, o in zip(eqn.outvars, outs):
                env[var] = o


    def _check_mesh(self, eqn) -> None:
        inner = eqn.params["spmd"].mesh
        if self.mesh is not None and inner != self.mesh:
            raise ShardingError(
                f"gp.spmd function {eqn.params['spmd'].name} over {inner} is called inside a gp.spmd function "
                f"over {self.mesh}{' (at ' + _source(eqn) + ')' if _source(eqn) else ''}: nested gp.spmd "
                f"functions must use the same mesh (call the inner function's plain version and annotate it)")

    def _call_inputs(self, eqn, ins: list[Value], ops: list[Op], scope: str, src: str) -> list[Value]:
        """The inputs of an inlined gp.spmd function, each given a sharding through its annotation."""
        return self._given(eqn.params["spmd"].ins(len(ins)), ins, ops, scope, src)

    def _call_outputs(self, eqn, outs: list[Value], ops: list[Op], scope: str, src: str) -> list[Value]:
        """The outputs of an inlined gp.spmd function, each given a sharding (the user's function's
        outputs all are: out_shardings, or None) through its annotation."""
        return self._given(eqn.params["spmd"].outs(len(outs)), outs, ops, scope, src)

    def _given(self, given, values: list[Value], ops: list[Op], scope: str, src: str) -> list[Value]:
        """Each value with a ``primitive.Given`` through an annotate op of its dims (None dims:
        unspecified); the others as they are."""
        return [v if g is None else self.annotate(v, g.dims, ops, src, scope) for v, g in zip(values, given)]

    def _barrier(self, eqn, ins: list[Value], ops: list[Op]) -> list[Value]:
        """Inputs of a differentiated checkpoint region, each behind an optimization barrier."""
        if not eqn.params.get("differentiated", False):
            return ins
        cse = eqn.params.get("prevent_cse", True)
        cse = (cse,) * len(ins) if isinstance(cse, bool) else tuple(cse)
        out = []
        for v, keep in zip(ins, cse):
            if not keep or v.is_const:
                out.append(v)
                continue
            b = new_value(self.ids, v.shape, v.dtype)
            op = Op(self.ids(), BARRIER, [v], [b], {}, jax.lax.optimization_barrier_p, source=_source(eqn))
            b.producer = op
            ops.append(op)
            out.append(b)
        return out


def trace_jaxpr(closed, mesh=None, *, output_ports: bool = False) -> Graph:
    """The IR of a closed jaxpr (``mesh``: the gp.spmd function's, checked against nested calls),
    dead code removed; ``output_ports``: each output a value of its own (see the module doc)."""
    graph = _Builder(IdGen(), mesh).convert(closed.jaxpr, closed.consts, ports=output_ports)
    return eliminate_dead_code(shifts.fold(graph))


def trace(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], mesh=None) -> Graph:
    """The IR of ``fn`` applied to flat arguments of the given shapes and dtypes (traced with
    ``mesh`` as JAX's abstract mesh, see constraints.tracing_mesh), dead code removed."""
    with tracing_mesh(mesh):
        closed = jax.make_jaxpr(fn)(*avals)
    return trace_jaxpr(closed, mesh)
