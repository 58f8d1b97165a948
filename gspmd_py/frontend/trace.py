"""Trace a JAX function into gspmd_py's IR.

``trace(fn, avals)`` runs ``jax.make_jaxpr`` and converts the jaxpr (``trace_jaxpr``):
nested calls (jit/pjit, closed_call, remat/checkpoint, custom_jvp_call, custom_vjp_call,
and other gp.spmd functions' ``spmd_call``) are inlined; scan/while/cond stay region ops
whose bodies are nested Graphs; a ``jax.shard_map`` stays one op, its operands and
results annotated with its in_specs / out_specs (frontend/manual.py); literals and closed-over arrays become constant Values.

A ``device_put`` inside the function is, per operand, a layout annotation (to a NamedSharding,
as with_sharding_constraint) or an identity (see ``constraints.put_layout``).

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

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .annotate import annotate_p, spec_entries
from .constraints import CONSTRAINTS, as_annotation, put_layout, tracing_mesh
from ..core import dtypes, jax_compat as compat
from ..core.errors import ShardingError
from . import batched_while, manual, shifts
from ..core.ir import Graph, IdGen, Op, Value, eliminate_dead_code, new_value

INLINE = compat.CALL_PRIMITIVES | {"spmd_call"}
REMAT = {"remat", "remat2", "checkpoint"}
BARRIER = "optimization_barrier_elementwise"  # one operand, one result: an elementwise identity
PUT = "device_put"  # per operand a layout annotation or an identity (constraints.put_layout)
REGION = {"scan": ("jaxpr",), "while": ("cond_jaxpr", "body_jaxpr"), "cond": ("branches",)}
# identities the tracer drops: ``name`` (jax.ad_checkpoint.checkpoint_name) only names a value for a
# remat policy, which JAX applied when it differentiated the program (the policy sees it there)
IDENTITY = {"name"}
MANUAL = "shard_map"  # a manual SPMD region: one op, its boundary annotated by its specs (frontend/manual.py)
_CALL_PARAMS = compat.CALL_PARAMS
_open = compat.open_jaxpr
# a collective over positional axes only is a reduction of those dims: what jax.vmap(axis_name=...)
# makes of lax.psum / pmean / pmax / pmin over the vmapped axis (equinox's BatchNorm, a per-example
# loss normalised over the batch; the gradient's psum over no axes); inlined as its reduce_* (over
# named axes it stays refused)
POSITIONAL = {"psum": jnp.sum, "pmax": jnp.max, "pmin": jnp.min}


def _source(eqn) -> str:
    return compat.source_summary(eqn.source_info)


def _linear_solve_call(params, ins):
    """(the solve jaxpr, its arguments) of a custom_linear_solve: its solve consts, then b.

    The forward value of ``custom_linear_solve(matvec, b, solve, ...)`` is ``solve(b)``;
    inlined, its ops (lu_solve's triangular solves over the batch) get their own rules, as
    any call's. Its transpose rule is gone, which nothing here needs: a gradient of the
    function is traced with its own custom_linear_solve."""
    n = params["const_lengths"]
    start = n.matvec + n.vecmat
    total = start + n.solve + n.transpose_solve
    return params["jaxprs"].solve, list(ins[start:start + n.solve]) + list(ins[total:])


def _positional_axes(params) -> bool:
    """Only positional axes (none at all: an identity, as the transpose of a vmapped pmean leaves)."""
    return all(isinstance(a, (int, np.integer)) for a in params.get("axes", ())) \
        and params.get("axis_index_groups") is None


def _positional_reduction(eqn):
    """The jaxpr of a positional psum / pmax / pmin equation as a reduction of each operand
    over its axes (the collective keeps each operand's dtype)."""
    reduce, axes = POSITIONAL[eqn.primitive.name], tuple(int(a) for a in eqn.params["axes"])
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    return jax.make_jaxpr(lambda *xs: [reduce(x, axis=axes).astype(x.dtype) for x in xs])(*avals)


class _Builder:
    def __init__(self, ids: IdGen, mesh=None):
        self.ids = ids
        self.mesh = mesh  # the outer gp.spmd function's mesh: inlined gp.spmd calls must use it

    def const(self, data, dtype=None, ops: list[Op] | None = None) -> Value:
        """A constant Value; ``dtype`` is the jaxpr's type for it (a Python scalar literal is
        weakly typed: ``int8_array * 3`` multiplies by an int8 3, not an int32 one). A typed PRNG
        key array (a model closing over its ``Rngs``) is its key data, a constant like any other,
        through ``random_wrap`` (appended to ``ops``); a float0 value (the gradient of an integer
        input) is a boolean constant of its shape, as JAX lowers float0."""
        if dtypes.is_key(dtype) or dtypes.is_key(getattr(data, "dtype", None)):
            return self._key_const(data, ops)
        if dtypes.is_float0(dtype) or dtypes.is_float0(getattr(data, "dtype", None)):
            return new_value(self.ids, np.shape(data), dtype, const=np.zeros(np.shape(data), bool))
        arr = np.asarray(data)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            arr = np.asarray(data, dtype=dtype)
        return new_value(self.ids, arr.shape, arr.dtype, const=arr)

    def _key_const(self, keys, ops: list[Op] | None) -> Value:
        if ops is None:
            raise ShardingError("a typed PRNG key constant needs an op list to be rebuilt in")
        closed, data = compat.key_wrap(keys)
        inner, consts = _open(closed)
        local = {inner.invars[0]: self.const(np.asarray(data))}
        local.update({var: self.const(c, var.aval.dtype, ops) for var, c in zip(inner.constvars, consts)})
        self._eqns(inner.eqns, local, ops)
        return self._read(local, inner.outvars[0], ops)

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
            env[var] = self.const(c, var.aval.dtype, ops)
        self._eqns(jaxpr.eqns, env, ops, scope, where)
        outs = [self._read(env, v, ops) for v in jaxpr.outvars]
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

    def _read(self, env, var, ops: list[Op] | None = None) -> Value:
        if hasattr(var, "val") and not hasattr(var, "suffix") and type(var).__name__ == "Literal":
            return self.const(var.val, var.aval.dtype, ops)
        return env[var]

    def _eqns(self, eqns, env, ops: list[Op], scope: tuple[str, ...] = (), where: str = "") -> None:
        """``scope``: the names of the calls inlined around these equations (``jnp.searchsorted``
        is ``jit[name=searchsorted]``); ``where``: the source line of the call around them, for
        equations whose own source is lost (inside a library's scan body)."""
        for eqn in eqns:
            name = eqn.primitive.name
            ins = [self._read(env, v, ops) for v in eqn.invars]
            sub = next((eqn.params[k] for k in _CALL_PARAMS if k in eqn.params and eqn.params[k] is not None), None)
            src = _source(eqn) or where
            if name in IDENTITY and len(ins) == len(eqn.outvars):
                for var, v in zip(eqn.outvars, ins):
                    env[var] = v
                continue
            if name == "optimization_barrier":  # per operand: an elementwise identity each
                for var, v in zip(eqn.outvars, ins):
                    env[var] = v if v.is_const else self._barrier_of(v, ops, src)
                continue
            if name == "custom_linear_solve":  # its value is its solve jaxpr's (jnp.linalg.solve, inv)
                sub, ins = _linear_solve_call(eqn.params, ins)
                name = "jit"
            if name in POSITIONAL and _positional_axes(eqn.params):
                name, sub = "jit", _positional_reduction(eqn)
            if name not in INLINE and name not in REGION and compat.is_high(eqn):
                name, sub = "hijax", compat.expand_high(eqn)  # its expansion into ordinary primitives
            if (name in INLINE or name == "hijax") and sub is not None:
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
                    local[var] = self.const(c, var.aval.dtype, ops)
                named = scope + (str(eqn.params["name"]),) if eqn.params.get("name") else scope
                self._eqns(inner.eqns, local, ops, named, src)
                outs = [self._read(local, iv, ops) for iv in inner.outvars]
                if name == "spmd_call":
                    outs = self._call_outputs(eqn, outs, ops, "/".join(scope), src)
                for ov, o in zip(eqn.outvars, outs):
                    env[ov] = o
                continue
            if name == PUT:
                for var, v, dst in zip(eqn.outvars, ins, eqn.params["devices"]):
                    env[var] = self._put(v, dst, ops, src, "/".join(scope))
                continue
            if name == MANUAL:  # its operands through annotations of its in_specs (frontend/manual.py)
                manual.check(eqn.params, self.mesh, src, annotated=_annotation_inside(manual.body(eqn.params)))
                dims = manual.in_dims(eqn.params, [v.rank for v in ins])
                ins = [self.annotate(v, d, ops, src, "/".join(scope)) for v, d in zip(ins, dims)]
            params = dict(eqn.params)
            if name == "while" and batched_while.is_batched(params):  # vmap of a data-dependent loop
                params, ins = batched_while.scalar_predicate(params, ins)
            outs = [new_value(self.ids, v.aval.shape, v.aval.dtype) for v in eqn.outvars]
            op = Op(self.ids(), name, ins, outs, params, eqn.primitive, source=src, scope="/".join(scope),
                    effects=bool(eqn.effects))
            for o in outs:
                o.producer = op
            if name in REGION:
                for key in REGION[name]:
                    subs = params[key]
                    for s in subs if isinstance(subs, (tuple, list)) else (subs,):
                        j, consts = _open(s)
                        op.regions.append(self.convert(j, consts, scope=scope, where=src))
            if name == "gspmd_tag":
                outs[0].name = eqn.params["name"]
            if name in CONSTRAINTS:  # jax.lax.with_sharding_constraint / reshard: an annotation
                as_annotation(op)
            ops.append(op)
            if name == MANUAL:  # its results through annotations of its out_specs
                dims = manual.out_dims(eqn.params, [v.rank for v in outs])
                outs = [self.annotate(v, d, ops, src, "/".join(scope)) for v, d in zip(outs, dims)]
            for var, o in zip(eqn.outvars, outs):
                env[var] = o


    def _put(self, v: Value, dst, ops: list[Op], source: str, scope: str) -> Value:
        """One operand of a ``device_put``: through a layout annotation, or as it is."""
        sharding = put_layout(dst)
        if sharding is None:
            return v
        out = new_value(self.ids, v.shape, v.dtype)
        op = Op(self.ids(), "device_put", [v], [out], {"sharding": sharding}, annotate_p, source=source, scope=scope)
        out.producer = op
        as_annotation(op)
        ops.append(op)
        return out

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
        return [v if not keep or v.is_const else self._barrier_of(v, ops, _source(eqn)) for v, keep in zip(ins, cse)]

    def _barrier_of(self, v: Value, ops: list[Op], source: str) -> Value:
        """``v`` through an optimization barrier of its own (appended to ``ops``)."""
        b = new_value(self.ids, v.shape, v.dtype)
        op = Op(self.ids(), BARRIER, [v], [b], {}, jax.lax.optimization_barrier_p, source=source)
        b.producer = op
        ops.append(op)
        return b


def trace_jaxpr(closed, mesh=None, *, output_ports: bool = False, fold_shifts: bool = True) -> Graph:
    """The IR of a closed jaxpr (``mesh``: the gp.spmd function's, checked against nested calls),
    dead code removed; ``output_ports``: each output a value of its own (see the module doc);
    ``fold_shifts``: shifts folded (shifts.py; the compiler runs that as a pass of its own)."""
    graph = _Builder(IdGen(), mesh).convert(*_open(closed), ports=output_ports)
    return eliminate_dead_code(shifts.fold(graph) if fold_shifts else graph)


def trace(fn: Callable, avals: Sequence[jax.ShapeDtypeStruct], mesh=None) -> Graph:
    """The IR of ``fn`` applied to flat arguments of the given shapes and dtypes (traced with
    ``mesh`` as JAX's abstract mesh, see constraints.tracing_mesh), dead code removed."""
    with tracing_mesh(mesh):
        closed = jax.make_jaxpr(fn)(*avals)
    return trace_jaxpr(closed, mesh)


def _annotation_inside(jaxpr) -> Optional[str]:
    """The first gp.annotate / gp.mesh_split in ``jaxpr`` or a jaxpr nested in it (said with its
    source line), or None: one inside a shard_map region is an error (manual.check says why)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gspmd_annotate":
            src = compat.source_summary(eqn.source_info)
            return eqn.params.get("origin", "gp.annotate") + (f" at {src}" if src else "")
        for sub in _subjaxprs(eqn.params.values()):
            found = _annotation_inside(sub)
            if found is not None:
                return found
    return None


def _subjaxprs(values):
    """The jaxprs among equation parameters (scan / cond / while / call bodies, tuples of branches)."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    for v in values:
        if isinstance(v, ClosedJaxpr):
            yield v.jaxpr
        elif isinstance(v, Jaxpr):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _subjaxprs(v)
