"""``spmd_call``: a gp.spmd program as a JAX primitive, so JAX's transformations compose with it.

A gp.spmd function called with tracers (under ``jax.jit``, ``jax.grad``, ``jax.vmap``,
``lax.scan``, another gp.spmd...) binds ``spmd_call_p`` on the closed jaxpr of the user's
function, with its in/out shardings written into that jaxpr as ``gp.annotate`` ops::

    { lambda ; a:f32[8,16] b:f32[16,32]. let
        c = spmd_call[jaxpr={ lambda ; x y. let x' = gspmd_annotate[spec=(('x',), ())] x
                                                 ...  in (o',) }
                      spmd=SpmdParams(mesh=Mesh(x=2, y=4), name=mlp)] a b
      in (c,) }

Its lowering plans that jaxpr with gspmd_py and lowers the partitioned program (a
``jax.shard_map`` over the plan's mesh) in place, so the program is staged into the
caller's computation. JAX never differentiates or batches the partitioned program (a
``check_vma=False`` shard_map whose collectives JAX would transform without knowing what
they were for): every transformation rule below builds the transformed *user* jaxpr
(``jax.jvp`` of it, its transpose, its ``jax.vmap``, its known/unknown split) and binds a
new ``spmd_call`` on it, which gspmd_py plans in turn, collectives recorded as for any
plan. The known half of a split is planned first, and the layouts of its residuals seed
the inputs of the unknown half (and of its transpose), so no data moves between the
forward and the backward program. The annotations travel with the jaxpr through every
transformation (``gp.annotate`` has its own jvp/transpose/batching rules), so tangents
and cotangents get the primal's shardings and a vmapped batch dim is left open.

The rules mirror ``jax._src.pjit``'s for ``jit_p`` (jvp, partial eval, transpose,
batching, partial_eval_jaxpr_custom, dce), without the sharding/layout bookkeeping.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
from jax._src import core as jcore
from jax._src import source_info_util
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import ClosedJaxpr, Primitive

from ..errors import ShardingError
from ..runtime.layout import own_mesh
from ..mesh import Mesh


@attrs.frozen(eq=True, hash=True)
class SpmdParams:
    """The non-jaxpr parameters of one spmd_call: the mesh, a name, the layouts its inputs arrive
    in when another spmd_call produced them (``in_hints``: the forward program's residuals,
    seeded so the backward program takes them as they are), and the plan when gspmd_py has
    already built it (the user's own call; the known half of a partial evaluation)."""

    mesh: Mesh
    name: str
    derived: bool = False  # a transformation of the user's program (jvp, transpose, vmap, split)
    in_hints: Optional[tuple] = None  # per input: canonical dims (tuples of AxisRefs) or None
    plan: Any = attrs.field(default=None, eq=False, hash=False, repr=False)
    combine_threshold_bytes: Optional[int] = None  # the combiner's group size limit (None: its default)
    shaping: Any = None  # partitioner.shaping.Shaping: collectives shaped for a hardware (None: none)

    def derive(self, in_hints: Optional[Sequence] = None) -> "SpmdParams":
        hints = None if in_hints is None or all(h is None for h in in_hints) else tuple(in_hints)
        return SpmdParams(self.mesh, self.name, True, hints, combine_threshold_bytes=self.combine_threshold_bytes,
                          shaping=self.shaping)

    def hints(self, n: int) -> list:
        return list(self.in_hints) if self.in_hints is not None else [None] * n


spmd_call_p = Primitive("spmd_call")
spmd_call_p.multiple_results = True


def bind(args: Sequence[Any], jaxpr: ClosedJaxpr, spmd: SpmdParams) -> list:
    return spmd_call_p.bind(*args, jaxpr=jaxpr, spmd=spmd)


def _abstract_eval(*avals, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    if jaxpr.effects:
        raise ShardingError(
            f"gp.spmd function {spmd.name} has side effects ({', '.join(sorted(map(str, jaxpr.effects)))}): "
            "debug callbacks, io_callback and state are not supported inside gp.spmd under JAX transformations")
    return list(jaxpr.out_avals)


spmd_call_p.def_abstract_eval(_abstract_eval)


def _impl(*args, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    """Eager evaluation, reached only under ``jax.disable_jit()`` (staged calls otherwise run inside
    a jit): op by op and unpartitioned, as jax.jit's functions run there; annotations are identities."""
    return jcore.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *args)


spmd_call_p.def_impl(_impl)


def hoist_tracer_consts(closed: ClosedJaxpr) -> tuple[ClosedJaxpr, tuple]:
    """A jaxpr that closed over tracers of an enclosing transformation, with all its constants
    turned into leading inputs (passed to spmd_call as arguments), and those constants."""
    if not any(isinstance(c, jcore.Tracer) for c in closed.consts):
        return closed, ()
    return ClosedJaxpr(pe.convert_constvars_jaxpr(closed.jaxpr), []), tuple(closed.consts)


def in_manual_context() -> bool:
    """Inside jax.shard_map / pmap: mesh axes are manual there, and a gp.spmd program cannot nest."""
    try:
        return bool(jax.sharding.get_abstract_mesh().manual_axes)
    except Exception:  # pragma: no cover - older/newer jax without the query: assume not
        return False


# -- lowering: plan the jaxpr and lower the partitioned program in place ---------------------
def plan_of(jaxpr: ClosedJaxpr, spmd: SpmdParams):
    """The Plan of an spmd_call: the one the user's call built, or a fresh one (derived programs)."""
    if spmd.plan is not None:
        return spmd.plan
    from ..compiler import plan_jaxpr

    n = len(jaxpr.in_avals)
    return plan_jaxpr(jaxpr, spmd.mesh, name=spmd.name + (" (derived)" if spmd.derived else ""),
                      in_dims=spmd.hints(n), in_labels=[f"the layout input {i} arrives in" for i in range(n)],
                      combine_threshold_bytes=spmd.combine_threshold_bytes,
                      **({} if spmd.shaping is None else {"shaping": spmd.shaping}))


def out_layouts(plan) -> list:
    """The canonical dims of ``plan``'s outputs as a staged call returns them (over the user's mesh)."""
    mesh = plan.mesh
    out = []
    for (s, _), v in zip(staged_out_shardings(plan), plan.graph.outputs):
        entries = list(s.spec) + [None] * (v.rank - len(s.spec))
        out.append(tuple(() if e is None else tuple(mesh.ref(a) for a in ((e,) if isinstance(e, str) else e))
                         for e in entries))
    return out


def run_padded(plan, *xs):
    """The partitioned program on global arrays of the logical shapes (uneven dims padded here),
    its outputs laid out over the user's mesh (layout.staged_sharding)."""
    padded = []
    for x, shape in zip(xs, plan.padded_in_shapes):
        if tuple(x.shape) != tuple(shape):
            x = jnp.pad(x, [(0, p - n) for n, p in zip(x.shape, shape)])
        padded.append(x)
    exe = plan.executable
    outs = list(exe.jitted(*padded))
    for i, (s, moved) in enumerate(exe.staged_out_shardings()):
        if moved:
            outs[i] = jax.lax.with_sharding_constraint(outs[i], s)
    return outs


def staged_out_shardings(plan) -> list:
    """Per output of ``plan``: (user-mesh NamedSharding, whether it differs from the plan's layout)."""
    return list(plan.executable.staged_out_shardings())


def _lowering(ctx, *args, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    if spmd.mesh.is_abstract:
        raise ShardingError(f"{spmd.mesh} is abstract: a gp.spmd function on it can be planned "
                            "(f.plan(...).lower_text()), not staged into a jax.jit")
    plan = plan_of(jaxpr, spmd)
    with own_mesh():
        return mlir.lower_fun(lambda *xs: run_padded(plan, *xs), multiple_results=True)(ctx, *args)


mlir.register_lowering(spmd_call_p, _lowering, cacheable=False)


# -- forward-mode AD ------------------------------------------------------------------------------
def _jvp(primals, tangents, *, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    nz_in = [type(t) is not ad.Zero for t in tangents]
    jvp_jaxpr, nz_out = ad.jvp_jaxpr(jaxpr, nz_in, instantiate=False)
    hints = spmd.hints(len(primals))
    outs = bind([*primals, *[t for t, nz in zip(tangents, nz_in) if nz]], jvp_jaxpr,
                spmd.derive(hints + [h for h, nz in zip(hints, nz_in) if nz]))
    primals_out, nz_tangents = outs[:len(jaxpr.out_avals)], iter(outs[len(jaxpr.out_avals):])
    tangents_out = [next(nz_tangents) if nz else ad.Zero(a.to_tangent_aval())
                    for nz, a in zip(nz_out, jaxpr.out_avals)]
    return primals_out, tangents_out


ad.primitive_jvps[spmd_call_p] = _jvp


# -- partial evaluation: known part now, unknown part staged (linearize, grad) ------------------
def _partial_eval(trace: pe.JaxprTrace, *tracers, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    known = [t.pval.is_known() for t in tracers]
    if all(known):
        return bind([t.pval.get_known() for t in tracers], jaxpr, spmd)
    if not any(known):  # nothing to evaluate now: the whole call is staged
        return _stage(trace, [trace.instantiate_const(t) for t in tracers], jaxpr, spmd)
    jaxpr_known, jaxpr_unknown, out_unknown, res_avals = pe.partial_eval_jaxpr_nounits(
        jaxpr, [not k for k in known], instantiate=False)
    known_vals = [t.pval.get_known() for t, k in zip(tracers, known) if k]
    hints = spmd.hints(len(tracers))
    res_hints: list = [None] * len(res_avals)
    outs: list = []
    if jaxpr_known.out_avals:
        p_known = spmd.derive([h for h, k in zip(hints, known) if k])
        if not spmd.mesh.is_abstract:  # plan the known half now: its residual layouts seed the unknown half
            plan = plan_of(jaxpr_known, p_known)
            p_known = attrs.evolve(p_known, plan=plan)
            res_hints = out_layouts(plan)[len(jaxpr_known.out_avals) - len(res_avals):]
        outs = bind(known_vals, jaxpr_known, p_known)
    n_known_out = len(outs) - len(res_avals)
    known_out, residuals = outs[:n_known_out], outs[n_known_out:]
    res_tracers = [trace.new_instantiated_const(r) for r in residuals]
    unknown_in = [trace.instantiate_const(t) for t, k in zip(tracers, known) if not k]
    # partial_eval_jaxpr_nounits puts the residuals first in the unknown jaxpr's inputs
    out_tracers = _stage(trace, [*res_tracers, *unknown_in], jaxpr_unknown,
                         spmd.derive(res_hints + [h for h, k in zip(hints, known) if not k]))
    known_it, unknown_it = iter(known_out), iter(out_tracers)
    return [next(unknown_it) if uk else next(known_it) for uk in out_unknown]


def _stage(trace: pe.JaxprTrace, in_tracers, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    """An spmd_call of unknown inputs, staged into the partial-eval trace."""
    out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(a), None) for a in jaxpr.out_avals]
    eqn = pe.new_eqn_recipe(trace, list(in_tracers), out_tracers, spmd_call_p, dict(jaxpr=jaxpr, spmd=spmd),
                            jcore.no_effects, source_info_util.current())
    for t in out_tracers:
        t.recipe = eqn
    return out_tracers


pe.custom_partial_eval_rules[spmd_call_p] = _partial_eval


def _pe_custom_params(unks_in, inst_in, kept_outs_known, kept_outs_staged, num_res_out, num_res_in,
                      params_known, params_staged):
    return (dict(params_known, spmd=params_known["spmd"].derive()),
            dict(params_staged, spmd=params_staged["spmd"].derive()))


pe.partial_eval_jaxpr_custom_rules[spmd_call_p] = (
    lambda *a, **k: pe.closed_call_partial_eval_custom_rule("jaxpr", _pe_custom_params, *a, **k))


def _dce(used_outputs: list[bool], eqn):
    if not any(used_outputs):
        return [False] * len(eqn.invars), None
    jaxpr = eqn.params["jaxpr"]
    new, used_inputs = pe.dce_jaxpr(jaxpr.jaxpr, used_outputs)
    if all(used_outputs) and all(used_inputs):
        return used_inputs, eqn
    spmd = eqn.params["spmd"]
    hints = [h for h, u in zip(spmd.hints(len(used_inputs)), used_inputs) if u]
    params = dict(eqn.params, jaxpr=ClosedJaxpr(new, jaxpr.consts), spmd=spmd.derive(hints))
    new_eqn = jcore.new_jaxpr_eqn([v for v, u in zip(eqn.invars, used_inputs) if u],
                                  [v for v, u in zip(eqn.outvars, used_outputs) if u],
                                  spmd_call_p, params, jcore.no_effects, eqn.source_info, eqn.ctx)
    return used_inputs, new_eqn


pe.dce_rules[spmd_call_p] = _dce


# -- reverse-mode AD: transpose the linear program and partition the transpose ------------------
def _transpose(cts, *args, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    linear = tuple(ad.is_undefined_primal(x) for x in args)
    nz_cts = tuple(type(ct) is not ad.Zero for ct in cts)
    residuals = [x for x, lin in zip(args, linear) if not lin]
    t_jaxpr = _transpose_jaxpr(jaxpr, linear, nz_cts)
    hints = [h for h, lin in zip(spmd.hints(len(args)), linear) if not lin] + [None] * sum(nz_cts)
    outs = iter(bind([*residuals, *[ct for ct, nz in zip(cts, nz_cts) if nz]], t_jaxpr, spmd.derive(hints)))
    return [next(outs) if lin else None for lin in linear]


def _transpose_jaxpr(jaxpr: ClosedJaxpr, linear: tuple[bool, ...], nz_cts: tuple[bool, ...]) -> ClosedJaxpr:
    """(residuals..., nonzero cotangents...) -> cotangents of the linear inputs."""
    res_avals = [a for a, lin in zip(jaxpr.in_avals, linear) if not lin]
    ct_avals = [a.to_cotangent_aval() if hasattr(a, "to_cotangent_aval") else a.to_tangent_aval()
                for a, nz in zip(jaxpr.out_avals, nz_cts) if nz]

    def transposed(*flat):
        res, cts = iter(flat[:len(res_avals)]), iter(flat[len(res_avals):])
        primals = [ad.UndefinedPrimal(a) if lin else next(res) for a, lin in zip(jaxpr.in_avals, linear)]
        cts_full = [next(cts) if nz else ad.Zero(a.to_tangent_aval()) for a, nz in zip(jaxpr.out_avals, nz_cts)]
        outs = ad.backward_pass(jaxpr.jaxpr, False, jaxpr.consts, primals, cts_full)
        return [ad.instantiate_zeros(o) for o, lin in zip(outs, linear) if lin]

    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in [*res_avals, *ct_avals]]
    return jax.make_jaxpr(transposed)(*avals)


ad.primitive_transposes[spmd_call_p] = _transpose


# -- batching: vmap the user's program, the batch dim left for propagation ----------------------
def _batch(axis_data, args, dims, *, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    b_jaxpr, out_dims = batching.batch_jaxpr2(jaxpr, axis_data, tuple(dims))
    # unbatched inputs (e.g. the residuals under jax.jacrev's vmap of a vjp) keep their layouts
    hints = [h if d is None else None for h, d in zip(spmd.hints(len(args)), dims)]
    return bind(args, b_jaxpr, spmd.derive(hints)), out_dims


batching.fancy_primitive_batchers[spmd_call_p] = _batch

