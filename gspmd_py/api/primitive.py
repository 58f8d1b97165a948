"""``spmd_call``: a gp.spmd program as a JAX primitive, so JAX's transformations compose with it.

A gp.spmd function called with tracers (under ``jax.jit``, ``jax.grad``, ``jax.vmap``,
``lax.scan``, another gp.spmd...) binds ``spmd_call_p`` on the closed jaxpr of the user's
function as written, its in/out shardings in the parameters (per input / output a
``Given``: canonical dims and their label, or None)::

    { lambda ; a:f32[8,16] b:f32[16,32]. let
        c = spmd_call[jaxpr={ lambda ; x y. let ... in (o,) }
                      spmd=SpmdParams(mesh=Mesh(x=2, y=4), name=mlp,
                                      in_shardings=(Given(((x,), ()), 'in_shardings of arg0'), None),
                                      out_shardings=None)] a b
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
forward and the backward program. The in/out shardings follow their positions through
every transformation as ``gp.annotate``'s own jvp/transpose/batching rules would move
annotations: a tangent takes its primal's, a cotangent input its output's and a cotangent
output its input's, a residual none; a vmapped batch dim is left open (or sharded over
``spmd_axis_name``).

The rules mirror JAX's own (``pjit``'s) for ``jit_p`` (jvp, partial eval, transpose,
batching, partial_eval_jaxpr_custom, dce), without the sharding/layout bookkeeping.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Primitive

from ..plan import Plan
from ..core import jax_compat as compat
from ..core.jax_compat import ad, batching, mlir, pe

from ..core.errors import ShardingError
from . import explicit
from ..frontend.batch_axes import check_batch_axes
from ..runtime.layout import own_mesh
from ..core.mesh import Mesh


@attrs.frozen
class Given:
    """What the user said of one input or output of a gp.spmd program (in_shardings /
    out_shardings): canonical dims (per dim a tuple of AxisRefs or None: open; ``dims`` None:
    the whole value left to propagation, as ``out_shardings=None`` says of an output) and what
    ``plan.explain`` calls it ("in_shardings of arg0", "out_shardings of output 0").

    An inlined call (frontend/trace.py) turns each Given into a ``gp.annotate`` op (dims None: an
    unspecified one); a position without a Given gets none."""

    dims: Optional[tuple]
    label: str


@attrs.frozen(eq=True, hash=True)
class SpmdParams:
    """The non-jaxpr parameters of one spmd_call: the mesh, a name, the layouts its inputs arrive
    in when another spmd_call produced them (``in_hints``: the forward program's residuals,
    seeded so the backward program takes them as they are), the user's in/out shardings
    (per input / output a ``Given`` or None), and the plan when gspmd_py has already built
    it (the user's own call; the known half of a partial evaluation)."""

    mesh: Mesh
    name: str
    derived: bool = False  # a transformation of the user's program (jvp, transpose, vmap, split)
    in_hints: Optional[tuple] = None  # per input: canonical dims (tuples of AxisRefs) or None
    plan: Any = attrs.field(default=None, eq=False, hash=False, repr=False)
    combine_threshold_bytes: Optional[int] = None  # the combiner's group size limit (None: its default)
    shaping: Any = None  # partitioner.shaping.Shaping: collectives shaped for a hardware (None: none)
    in_shardings: Optional[tuple] = None  # per input: Given or None (None: no input has one)
    out_shardings: Optional[tuple] = None  # per output: Given or None (None: no output has one)

    def derive(self, in_hints: Optional[Sequence] = None, ins: Optional[Sequence] = None,
               outs: Optional[Sequence] = None) -> "SpmdParams":
        """The parameters of a transformation of this program: per position of the transformed
        program, its inputs' hints and its inputs' and outputs' user shardings."""
        return SpmdParams(self.mesh, self.name, True, _some(in_hints), combine_threshold_bytes=self.combine_threshold_bytes,
                          shaping=self.shaping, in_shardings=_some(ins), out_shardings=_some(outs))

    def hints(self, n: int) -> list:
        return list(self.in_hints) if self.in_hints is not None else [None] * n

    def ins(self, n: int) -> list[Optional[Given]]:
        """Per input (``n`` of them): its in_sharding, or None."""
        return list(self.in_shardings) if self.in_shardings is not None else [None] * n

    def outs(self, n: int) -> list[Optional[Given]]:
        """Per output (``n`` of them): its out_sharding, or None."""
        return list(self.out_shardings) if self.out_shardings is not None else [None] * n


def _some(entries: Optional[Sequence]) -> Optional[tuple]:
    """``entries`` as a tuple, or None when there are none or all of them are None."""
    return None if entries is None or all(e is None for e in entries) else tuple(entries)


spmd_call_p = Primitive("spmd_call")
spmd_call_p.multiple_results = True
# Its arrays in and out are ordinary ones: a "hijax" primitive inside its jaxpr (jax >= 0.11:
# jnp.searchsorted's, under jnp.interp) is expanded by gp.spmd's own tracer, so a trace that
# lowers hijax primitives (jit's linearization under jax.grad, 0.12) keeps the call as it is
# (Primitive.is_high would call it high for what its jaxpr holds, with no to_lojax to lower it).
spmd_call_p.is_high = lambda *avals, **params: False


def bind(args: Sequence[Any], jaxpr: ClosedJaxpr, spmd: SpmdParams) -> list:
    if spmd.plan is None and explicit.typed(spmd.mesh):
        spmd = with_plan(jaxpr, spmd, [jax.typeof(x) for x in args])
    return spmd_call_p.bind(*args, jaxpr=jaxpr, spmd=spmd)


def with_plan(jaxpr: ClosedJaxpr, spmd: SpmdParams, in_avals: Sequence) -> SpmdParams:
    """``spmd`` with its plan, built now over a mesh with Explicit axes (the outputs' types need it;
    api/explicit.py), its inputs' types seeded as the layouts they arrive in; as it is elsewhere."""
    if spmd.plan is not None or not explicit.typed(spmd.mesh):
        return spmd
    hints = [h if h is not None else explicit.type_dims(spmd.mesh, a) for h, a in zip(spmd.hints(len(in_avals)), in_avals)]
    spmd = attrs.evolve(spmd, in_hints=_some(hints))
    return attrs.evolve(spmd, plan=plan_of(jaxpr, spmd))


def out_avals(jaxpr: ClosedJaxpr, spmd: SpmdParams) -> list:
    """The outputs' avals: typed with their layouts over a mesh with Explicit axes (api/explicit.py)."""
    if not explicit.typed(spmd.mesh):
        return list(jaxpr.out_avals)
    return explicit.out_avals(plan_of(jaxpr, spmd), jaxpr.out_avals)


def _typed_outs(jaxpr: ClosedJaxpr, spmd: SpmdParams) -> list:
    """Per output, its user out_sharding; over a mesh with Explicit axes, the Given of its type."""
    outs = spmd.outs(len(jaxpr.out_avals))
    if not explicit.typed(spmd.mesh):
        return outs
    return [Given(explicit.type_dims(spmd.mesh, a), f"the type of output {i}" if g is None else g.label)
            for i, (g, a) in enumerate(zip(outs, out_avals(jaxpr, spmd)))]


def _abstract_eval(*avals, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    if jaxpr.effects:
        raise ShardingError(
            f"gp.spmd function {spmd.name} has side effects ({', '.join(sorted(map(str, jaxpr.effects)))}): "
            "debug callbacks, io_callback and state are not supported inside gp.spmd under JAX transformations")
    return out_avals(jaxpr, spmd)


spmd_call_p.def_abstract_eval(_abstract_eval)


def _impl(*args, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    """Eager evaluation, reached only under ``jax.disable_jit()`` (staged calls otherwise run inside
    a jit): op by op and unpartitioned, as jax.jit's functions run there; annotations are identities."""
    return compat.eval_closed(jaxpr, *args)


spmd_call_p.def_impl(_impl)


def hoist_tracer_consts(closed: ClosedJaxpr) -> tuple[ClosedJaxpr, tuple]:
    """A jaxpr that closed over tracers of an enclosing transformation, with all its constants
    turned into leading inputs (passed to spmd_call as arguments), and those constants."""
    if not any(isinstance(c, compat.core.Tracer) for c in closed.consts):
        return closed, ()
    return compat.detach_consts(closed), tuple(closed.consts)


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

    n, m = len(jaxpr.in_avals), len(jaxpr.out_avals)
    ins, outs = spmd.ins(n), spmd.outs(m)
    # an input with in_shardings takes them; one without, the layout it arrives in (if known)
    ins = [None if g is None or g.dims is None else g for g in ins]
    in_dims = [h if g is None else g.dims for g, h in zip(ins, spmd.hints(n))]
    in_labels = [f"the layout input {i} arrives in" if g is None else g.label for i, g in enumerate(ins)]
    return plan_jaxpr(jaxpr, spmd.mesh, name=spmd.name + (" (derived)" if spmd.derived else ""),
                      in_dims=in_dims, in_labels=in_labels, out_dims=[None if g is None else g.dims for g in outs],
                      out_labels=[f"out_shardings of output {i}" if g is None else g.label for i, g in enumerate(outs)],
                      combine_threshold_bytes=spmd.combine_threshold_bytes,
                      **({} if spmd.shaping is None else {"shaping": spmd.shaping}))


def out_layouts(plan: Plan) -> list:
    """The canonical dims of ``plan``'s outputs as a staged call returns them (over the user's mesh)."""
    return [_user_dims(plan, s, v.rank) for (s, _), v in zip(plan.lower().staged_out_shardings(), plan.graph.outputs)]


def in_layouts(plan: Plan) -> list:
    """The canonical dims of ``plan``'s inputs as a staged call takes them (over the user's mesh)."""
    return [_user_dims(plan, s, v.rank) for s, v in zip(plan.lower().staged_in_shardings(), plan.graph.inputs)]


def _user_dims(plan: Plan, sharding, rank: int) -> tuple:
    entries = list(sharding.spec) + [None] * (rank - len(sharding.spec))
    return tuple(() if e is None else tuple(plan.mesh.ref(a) for a in ((e,) if isinstance(e, str) else e))
                 for e in entries)


def run_padded(plan: Plan, *xs):
    """The partitioned program on global arrays of the logical shapes (uneven dims padded here),
    its outputs laid out over the user's mesh (layout.staged_sharding)."""
    padded = []
    for x, shape in zip(xs, plan.padded_in_shapes):
        if tuple(x.shape) != tuple(shape):
            x = jnp.pad(x, [(0, p - n) for n, p in zip(x.shape, shape)])
        padded.append(x)
    lowered = plan.lower()
    outs = list(lowered.jitted(*padded))
    for i, (s, moved) in enumerate(lowered.staged_out_shardings()):
        if moved:
            outs[i] = jax.lax.with_sharding_constraint(outs[i], s)
    return outs


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
    hints, ins, given_outs = spmd.hints(len(primals)), spmd.ins(len(primals)), _typed_outs(jaxpr, spmd)
    params = spmd.derive(hints + _kept(hints, nz_in), ins + _kept(ins, nz_in), given_outs + _kept(given_outs, nz_out))
    outs = bind([*primals, *_kept(tangents, nz_in)], jvp_jaxpr, params)
    primals_out, nz_tangents = outs[:len(jaxpr.out_avals)], iter(outs[len(jaxpr.out_avals):])
    tangents_out = [next(nz_tangents) if nz else ad.Zero(a.to_tangent_aval())
                    for nz, a in zip(nz_out, out_avals(jaxpr, spmd))]
    return primals_out, tangents_out


ad.primitive_jvps[spmd_call_p] = _jvp


def _kept(entries: Sequence, keep: Sequence[bool]) -> list:
    """The entries whose ``keep`` is true, in order."""
    return [e for e, k in zip(entries, keep) if k]


def _dropped(entries: Sequence, keep: Sequence[bool]) -> list:
    """The entries whose ``keep`` is false, in order."""
    return [e for e, k in zip(entries, keep) if not k]


# -- partial evaluation: known part now, unknown part staged (linearize, grad) ------------------
def _partial_eval(trace: pe.JaxprTrace, *tracers, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    known = [t.pval.is_known() for t in tracers]
    if all(known):
        return bind([t.pval.get_known() for t in tracers], jaxpr, spmd)
    if not any(known):  # nothing to evaluate now: the whole call is staged
        return _stage(trace, [trace.instantiate_const(t) for t in tracers], jaxpr, spmd)
    jaxpr_known, jaxpr_unknown, out_unknown, res_avals = pe.partial_eval_jaxpr_nounits(
        jaxpr, [not k for k in known], instantiate=False)
    # a residual that is a known input is passed on as it is, never returned by the known program (as
    # jax.jit's partial evaluation forwards it): a donated input would be aliased to that output and
    # deleted while the caller still holds it (jax.grad of a gp.spmd function with donate_argnums)
    res_fwd = _input_residuals(jaxpr_known, len(res_avals))
    n_res = sum(f is None for f in res_fwd)  # residuals the known program computes
    if n_res < len(res_avals):
        jaxpr_known = compat.prune_outputs(
            jaxpr_known, [True] * (len(jaxpr_known.out_avals) - len(res_avals)) + [f is None for f in res_fwd])
    known_vals = [t.pval.get_known() for t, k in zip(tracers, known) if k]
    hints, ins, given_outs = spmd.hints(len(tracers)), spmd.ins(len(tracers)), spmd.outs(len(out_unknown))
    computed_hints: list = [None] * n_res
    forwarded_hints: Optional[list] = None
    outs: list = []
    if jaxpr_known.out_avals:
        p_known = spmd.derive(_kept(hints, known), _kept(ins, known),
                              _dropped(given_outs, out_unknown) + [None] * n_res)
        if not spmd.mesh.is_abstract:  # plan the known half now: its residual layouts seed the unknown half
            plan = plan_of(jaxpr_known, p_known)
            p_known = attrs.evolve(p_known, plan=plan)
            computed_hints = out_layouts(plan)[len(jaxpr_known.out_avals) - n_res:]
            # a forwarded input's layout as the known program takes it: over the user's mesh, as a
            # computed residual's (an in_sharding over a sub-axis, 'x:(1)2', is not a layout the
            # unknown half's jit can be given: jax.jit's transpose then failed to read it back)
            taken = in_layouts(plan)
            forwarded_hints = taken if len(taken) == len(known_vals) else None
        outs = bind(known_vals, jaxpr_known, p_known)
    n_known_out = len(outs) - n_res
    known_out, computed, computed_hints = outs[:n_known_out], iter(outs[n_known_out:]), iter(computed_hints)
    known_hints = _kept(hints, known) if forwarded_hints is None else forwarded_hints
    residuals = [next(computed) if f is None else known_vals[f] for f in res_fwd]
    res_hints = [next(computed_hints) if f is None else known_hints[f] for f in res_fwd]
    res_tracers = [trace.new_instantiated_const(r) for r in residuals]
    unknown_in = [trace.instantiate_const(t) for t, k in zip(tracers, known) if not k]
    # partial_eval_jaxpr_nounits puts the residuals first in the unknown jaxpr's inputs
    out_tracers = _stage(trace, [*res_tracers, *unknown_in], jaxpr_unknown,
                         spmd.derive(res_hints + _dropped(hints, known), [None] * len(res_avals) + _dropped(ins, known),
                                     _kept(given_outs, out_unknown)))
    known_it, unknown_it = iter(known_out), iter(out_tracers)
    return [next(unknown_it) if uk else next(known_it) for uk in out_unknown]


def _input_residuals(jaxpr_known: ClosedJaxpr, n_res: int) -> list[Optional[int]]:
    """Per residual (the last ``n_res`` outputs of ``jaxpr_known``): the index of the known input it
    is, or None when the known program computes it."""
    j = jaxpr_known.jaxpr
    pos = {id(v): i for i, v in enumerate(j.invars)}
    return [pos.get(id(v)) for v in j.outvars[len(j.outvars) - n_res:]]


def _stage(trace: pe.JaxprTrace, in_tracers, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    """An spmd_call of unknown inputs, staged into the partial-eval trace."""
    spmd = with_plan(jaxpr, spmd, [t.aval for t in in_tracers])
    out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(a), None) for a in out_avals(jaxpr, spmd)]
    eqn = pe.new_eqn_recipe(trace, list(in_tracers), out_tracers, spmd_call_p, dict(jaxpr=jaxpr, spmd=spmd),
                            compat.core.no_effects, compat.current_source())
    for t in out_tracers:
        t.recipe = eqn
    return out_tracers


pe.custom_partial_eval_rules[spmd_call_p] = _partial_eval


def _pe_custom_params(unks_in, inst_in, kept_outs_known, kept_outs_staged, num_res_out, num_res_in,
                      params_known, params_staged):
    """As pjit's updater: the known program takes the known inputs and returns the kept known
    outputs and ``num_res_out`` residuals; the staged one takes ``num_res_in`` residuals and the
    instantiated inputs and returns the kept staged outputs. Residuals have no user shardings;
    the inputs' hints are dropped (the layouts they arrive in are not known here)."""
    kept_outs_known, kept_outs_staged = list(kept_outs_known), list(kept_outs_staged)
    spmd: SpmdParams = params_known["spmd"]
    ins, outs = spmd.ins(len(unks_in)), spmd.outs(len(kept_outs_known))
    known = spmd.derive(None, _dropped(ins, unks_in), _kept(outs, kept_outs_known) + [None] * num_res_out)
    staged = spmd.derive(None, [None] * num_res_in + _kept(ins, inst_in), _kept(outs, kept_outs_staged))
    return dict(params_known, spmd=known), dict(params_staged, spmd=staged)


pe.partial_eval_jaxpr_custom_rules[spmd_call_p] = (
    lambda *a, **k: pe.closed_call_partial_eval_custom_rule("jaxpr", _pe_custom_params, *a, **k))


def _dce(used_outputs: list[bool], eqn):
    if not any(used_outputs):
        return [False] * len(eqn.invars), None
    new, used_inputs = compat.dce_closed(eqn.params["jaxpr"], used_outputs)
    if all(used_outputs) and all(used_inputs):
        return used_inputs, eqn
    spmd, n = eqn.params["spmd"], len(used_inputs)
    derived = spmd.derive(_kept(spmd.hints(n), used_inputs), _kept(spmd.ins(n), used_inputs),
                          _kept(spmd.outs(len(used_outputs)), used_outputs))
    params = dict(eqn.params, jaxpr=new, spmd=derived)
    new_eqn = compat.core.new_jaxpr_eqn([v for v, u in zip(eqn.invars, used_inputs) if u],
                                  [v for v, u in zip(eqn.outvars, used_outputs) if u],
                                  spmd_call_p, params, compat.core.no_effects, eqn.source_info, eqn.ctx)
    return used_inputs, new_eqn


compat.register_dce(spmd_call_p, _dce)


# -- reverse-mode AD: transpose the linear program and partition the transpose ------------------
def _transpose(cts, *args, jaxpr: ClosedJaxpr, spmd: SpmdParams):
    linear = tuple(ad.is_undefined_primal(x) for x in args)
    nz_cts = tuple(type(ct) is not ad.Zero for ct in cts)
    residuals = [x for x, lin in zip(args, linear) if not lin]
    t_jaxpr = _transpose_jaxpr(jaxpr, linear, nz_cts)
    hints, ins, given_outs = spmd.hints(len(args)), spmd.ins(len(args)), spmd.outs(len(cts))
    # a cotangent input takes its output's out_shardings; a cotangent output its input's in_shardings
    params = spmd.derive(_dropped(hints, linear) + [None] * sum(nz_cts),
                         _dropped(ins, linear) + _kept(given_outs, nz_cts), _cotangent_outs(spmd, ins, args, linear))
    outs = iter(bind([*residuals, *_kept(cts, nz_cts)], t_jaxpr, params))
    return [next(outs) if lin else None for lin in linear]


def _cotangent_outs(spmd: SpmdParams, ins: list, args: Sequence, linear: Sequence[bool]) -> list:
    """Per linear input, the out_sharding of its cotangent: its in_sharding; over a mesh with
    Explicit axes, its primal's type (JAX checks a cotangent's type against it)."""
    if not explicit.typed(spmd.mesh):
        return _kept(ins, linear)
    dims = [explicit.cotangent_dims(spmd.mesh, x.aval) if lin else None for x, lin in zip(args, linear)]
    return [g if d is None else Given(d, f"the type of input {i}")
            for i, (g, d, lin) in enumerate(zip(ins, dims, linear)) if lin]


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
    batch = _batch_axes(spmd.mesh, axis_data.spmd_name)
    check_batch_axes(spmd.name, batch, list(spmd.ins(len(args))) + list(spmd.outs(len(out_dims))))
    ins = [_batched(g, d, batch, a.ndim) for g, d, a in zip(spmd.ins(len(args)), dims, jaxpr.in_avals)]
    outs = [_batched(g, d, batch, a.ndim) for g, d, a in zip(spmd.outs(len(out_dims)), out_dims, jaxpr.out_avals)]
    return bind(args, b_jaxpr, spmd.derive(hints, ins, outs)), out_dims


def _batch_axes(mesh: Mesh, spmd_name) -> Optional[tuple]:
    """The mesh axes of ``jax.vmap(..., spmd_axis_name=...)`` (None: the batch dim is open)."""
    if spmd_name is None:
        return None
    return tuple(mesh.ref(a) for a in (spmd_name if isinstance(spmd_name, (tuple, list)) else (spmd_name,)))


def _batched(given: Optional[Given], d: Optional[int], batch: Optional[tuple], rank: int) -> Optional[Given]:
    """The Given of a position (of unbatched ``rank``) that vmap batches at dim ``d``, as
    gp.annotate's batching rule moves an annotation: the batch dim open, or over the
    spmd_axis_name axes ``batch``; an open Given stays open without them and becomes, with
    them, sharded over them and replicated elsewhere."""
    if d is None or given is None or (given.dims is None and batch is None):
        return given
    dims = list(given.dims if given.dims is not None else ((),) * rank)
    dims.insert(d, batch)
    return Given(tuple(dims), given.label)


batching.fancy_primitive_batchers[spmd_call_p] = _batch

