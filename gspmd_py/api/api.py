"""The user-facing entry point ``gp.spmd``.

    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    plan = f.plan(x, w)       # trace -> propagate -> partition; runs nothing
    out = f(x, w)             # places inputs, runs the one SPMD program, global jax.Arrays out
    jax.jit(f)(x, w), jax.grad(lambda x, w: f(x, w).sum())(x, w), jax.vmap(f)(xs, ws)

A gp.spmd function is a JAX function. Called with concrete arrays it runs its plan
directly (the fast path). Called with tracers (under any JAX transformation, or inside
another gp.spmd function) it stages ``spmd_call`` (primitive.py) inside a ``jax.jit``
whose in/out shardings are the plan's: JAX transforms the user's jaxpr, gspmd_py
partitions each transformed program, and nested gp.spmd calls are inlined into the outer
plan.

Arguments work as under ``jax.jit`` (arguments.py): ``static_argnums`` /
``static_argnames`` (static values key the plan cache), keyword arguments (their leaves
open to propagation; ``in_shardings`` covers the positional arguments that are not
static), ``donate_argnums`` (forwarded to the jit of the program: a donated array that
is already laid out as the plan wants is consumed).
"""
from __future__ import annotations

import contextlib

import functools
from typing import Any, Callable, Optional

import attrs
import jax

from ..core import jax_compat as compat
from .arguments import Call, Signature, output_leaves
from ..runtime.boundary import PLAN_CACHE_SIZE, PlanCache, call_key
from ..runtime.placed import logical_shape, unpad
from ..core.errors import ArgumentError, ShardingError, SpecError
from ..compiler import Dims, gc_paused, plan_jaxpr
from ..core.ir import Value
from ..core.mesh import Mesh
from ..plan import Plan
from ..runtime.stages import Lowered
from ..partitioner.shaping import Shaping
from ..frontend.batch_axes import duplicate_axis_error
from . import explicit
from .primitive import Given, SpmdParams, bind, hoist_tracer_consts, in_manual_context
from ..frontend.constraints import constraint_errors, tracing_mesh
from ..frontend.specs import memory_kinds, spec_dims


@attrs.define(eq=False)
class _Entry:
    """One cached signature: the user's jaxpr, its plan, and the jit that stages it."""

    jaxpr: Any
    plan: Plan
    params: SpmdParams
    out_tree: Any
    donate: tuple[int, ...]
    closure: tuple = ()  # closed-over tracers of an enclosing transformation: leading inputs of the jaxpr
    _staged: Optional[Callable] = None

    def staged(self, leaves):
        """The plan staged into the caller's trace: a jit (the plan's shardings) of spmd_call."""
        if self._staged is None:
            plan = self.plan
            if plan.mesh.is_abstract:
                raise ShardingError(f"{plan.mesh} is abstract: {plan.fn_name} can be planned and lowered "
                                    f"(f.plan(...).lower_text()), not run or staged into a JAX transformation")
            lowered = plan.lower()
            in_sh, out_sh = lowered.staged_in_shardings(), tuple(s for s, _ in lowered.staged_out_shardings())
            # a zero-size input holds no data: left unspecified, as it travels (runtime/stages.py). A
            # sharding there becomes its cotangent's out_sharding in jit's transpose, and JAX 0.10
            # returns a zero-size output whole on each device under a split sharding (a jax.Array
            # that cannot be read back)
            in_sh = tuple(None if not v.size else s for s, v in zip(in_sh, plan.graph.inputs))
            jaxpr, params, mesh = self.jaxpr, self.params, plan.mesh
            self._staged = jax.jit(lambda *xs: tuple(bind(explicit.retyped(mesh, xs, in_sh), jaxpr, params)),
                                   in_shardings=in_sh,
                                   out_shardings=out_sh, donate_argnums=self.donate)
        leaves = [x if (m := logical_shape(x)) is None else unpad(x, m) for x in leaves]  # plan.place's padding off
        try:
            outs = self._staged(*self.closure, *leaves)
        except Exception as e:  # noqa: BLE001 - JAX's error of a vmap over an axis the plan uses, said clearly
            err = duplicate_axis_error(self.plan.fn_name, e, self._layouts())
            if err is None:
                raise
            raise err from None
        return jax.tree_util.tree_unflatten(self.out_tree, list(outs))

    def _layouts(self) -> list:
        """(label, NamedSharding) per input and output of the staged call, for messages."""
        plan = self.plan
        lowered = plan.lower()
        return (list(zip(plan.in_names, lowered.staged_in_shardings()))
                + [(f"output {i}", s) for i, (s, _) in enumerate(lowered.staged_out_shardings())])


class Spmd:
    """A function partitioned by gspmd_py (see ``spmd``)."""

    def __init__(self, fn: Callable, mesh: Mesh, in_shardings=None, out_shardings=None, *,
                 static_argnums=(), static_argnames=(), donate_argnums=(),
                 combine_threshold_bytes: Optional[int] = None, tactics=None, hardware=None,
                 collective_matmul_bytes: Optional[int] = None):
        from ..search.tactics import check_tactics

        if isinstance(mesh, jax.sharding.Mesh):
            mesh = Mesh.from_jax(mesh)
        if not isinstance(mesh, Mesh):
            raise ShardingError(f"gp.spmd needs a gp.Mesh or a jax.sharding.Mesh, got {type(mesh).__name__}")
        if combine_threshold_bytes is not None and (not isinstance(combine_threshold_bytes, int)
                                                    or isinstance(combine_threshold_bytes, bool)
                                                    or combine_threshold_bytes < 0):
            raise ShardingError(f"gp.spmd: combine_threshold_bytes must be a non-negative int (0: never combine), "
                                f"got {combine_threshold_bytes!r}")
        self.fn, self.mesh = fn, mesh
        self.combine_threshold_bytes = combine_threshold_bytes
        self.shaping = Shaping(hardware, collective_matmul_bytes)
        _no_tactics(in_shardings, "in_shardings")
        _no_tactics(out_shardings, "out_shardings")
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        self.tactics = check_tactics(tactics)
        self._sig = Signature.of(fn, static_argnums, static_argnames, donate_argnums)
        # bounded LRUs (PLAN_CACHE_SIZE = 64 keys each): entries by full call key, and the fast path's
        # entries by call_key (tree + type/shape/dtype per leaf) for calls without statics or keywords
        # (the entries' cache collects what it evicts: runtime/boundary.py's collect_evicted; the fast
        # path's holds the same entries, evicted in step)
        self._entries = PlanCache(PLAN_CACHE_SIZE, collect=True)
        self._fast = PlanCache(PLAN_CACHE_SIZE)
        # copy __name__/__doc__/..., never the wrapped object's __dict__ (eqx.filter_jit's "fn" field
        # would replace this object's own attributes)
        functools.update_wrapper(self, fn, updated=())

    def __copy__(self) -> "Spmd":
        return self  # a function: copies are itself, as Python's functions' are

    def __deepcopy__(self, memo) -> "Spmd":
        return self

    def __reduce__(self):
        """Pickled as the gp.spmd call that makes it (``fn`` as pickle takes functions: by
        reference); the loaded function builds its plans on first use."""
        sig = self._sig
        options = dict(static_argnums=tuple(sorted(sig.static_argnums)),
                       static_argnames=tuple(sorted(sig.static_argnames)),
                       donate_argnums=tuple(sorted(sig.donate_argnums)),
                       combine_threshold_bytes=self.combine_threshold_bytes, tactics=self.tactics,
                       hardware=self.shaping.hardware, collective_matmul_bytes=self.shaping.collective_matmul_bytes)
        return (functools.partial(Spmd, **options), (self.fn, self.mesh, self.in_shardings, self.out_shardings))

    def __get__(self, obj, objtype=None):
        """As a method (``@gp.spmd`` on a ``def`` in a class), bind the instance as the first
        positional argument, as jax.jit does: it is ``arg0`` (a pytree, or static by
        ``static_argnums=0``) and ``in_shardings`` counts it."""
        return self if obj is None else functools.partial(self, obj)

    def reuse_plans(self, other: "Spmd") -> None:
        """Run the plans ``other`` built instead of planning again (gp.auto_shard: the search built
        the plan; its replay, a gp.spmd of the decisions, runs it for the same signature)."""
        self._entries = other._entries

    def plan(self, *args, **kwargs) -> Plan:
        """The plan for these arguments (arrays or jax.ShapeDtypeStructs): compiles nothing, runs nothing."""
        return self._entry(self._sig.bind(args, kwargs, plan_only=True)).plan

    def lower(self, *args, **kwargs) -> Lowered:
        """The plan's Lowered stage for these arguments (arrays or jax.ShapeDtypeStructs), as
        the call runs it (``.compile()``: compiled on its first use, once; runtime/stages.py)."""
        return self.plan(*args, **kwargs).lower()

    def __call__(self, *args, **kwargs):
        if jax.config.jax_disable_jit:  # debugging, as jax.jit: the plain function, op by op
            return self.fn(*args, **kwargs)
        fast = not kwargs and not self._sig.static_argnums and not self._sig.static_argnames
        if fast:  # a call seen before with concrete arrays: flatten, key, lookup, the compiled call
            key, leaves, _ = call_key(args)
            key = (key, compat.trace_context(), explicit.arg_layouts(leaves) if explicit.typed(self.mesh) else ())
            e = self._fast.get(key)
            if e is not None:
                lowered = e.plan.lower()
                lowered.check_same_program()
                return lowered.compile().run(leaves)
        call = self._sig.bind(args, kwargs)
        if call.traced and in_manual_context():
            raise ArgumentError(
                f"{self._sig.fn_name} is called inside jax.shard_map/pmap: a gp.spmd function is a whole SPMD "
                f"program over {self.mesh} and cannot run per device; call the plain function there, or call "
                f"the gp.spmd function outside the shard_map")
        entry = self._entry(call)
        if call.traced or entry.closure:  # under a JAX transformation, or inside another gp.spmd function
            call.check_live()  # (the direct call's boundary checks its own leaves)
            return entry.staged(call.leaves)
        lowered = entry.plan.lower()
        lowered.check_same_program()  # multi-process runs only: every process planned this program
        if fast:
            self._fast.put(key, entry)  # (tracers never get here: their calls are staged above)
        return lowered.compile().run(call.leaves)

    def from_local(self, *local_args, global_shapes=None):
        """Call with each process's own block of every argument (multi-process runs; see
        ``gspmd_py/runtime/global_inputs.py``): an argument split across processes by its in_sharding
        is passed as the part this process's devices hold (``gp.distributed.local_slices``),
        any other argument whole.
        ``global_shapes`` (a shape or None per leaf) gives the global shapes that equal blocks
        cannot infer (uneven dims). Outputs are global jax.Arrays, as from ``f(...)``."""
        from ..runtime.global_inputs import from_local

        return from_local(self, local_args, global_shapes)

    # -- planning ------------------------------------------------------------------------
    def _entry(self, call: Call) -> _Entry:
        key = (call.key, compat.trace_context(), self._arg_types(call.leaves))
        e = self._entries.get(key)
        if e is None:
            # the user's trace and the plan with the collector paused (compiler.gc_paused says
            # why), unless tactics search: their garbage must go as it is made
            with gc_paused() if not self.tactics else contextlib.nullcontext():
                e = self._build(call)
            if not e.closure:  # closed-over tracers belong to one trace: never cached
                self._entries.put(key, e)
        return e

    def _arg_types(self, leaves) -> tuple:
        """Over a mesh with Explicit axes, per leaf the layout its type carries (api/explicit.py):
        the function is traced with it, as under jax.jit, so it keys the plan caches; else ()."""
        return explicit.arg_specs(self.mesh, leaves) if explicit.typed(self.mesh) else ()

    def open_pipelines(self, *args, **kwargs) -> tuple:
        """The open ``gp.pipeline`` calls (no schedule given) that tracing the function for these
        arguments meets with no schedule decided: frontend/pipeline.py's OpenPipeline records, in
        trace order (gp.auto_shard prices schedules for them). Traces only; plans nothing."""
        call = self._sig.bind(args, kwargs, plan_only=True)
        return tuple(self._trace(call, None)[-1])

    def _trace(self, call: Call, decision) -> tuple:
        """The user's function traced for ``call``, open pipelines scheduled by ``decision``:
        (closed jaxpr, closure, out_tree, out_dims, the memory kinds out_shardings ask for, the open
        pipelines met unscheduled)."""
        from ..frontend.pipeline import scheduled

        box: list = []

        def flat_fn(*leaves):  # the user's function as written: in/out shardings go to the compiler as seeds
            args, kwargs = call.rebuild(list(leaves))
            out = self.fn(*args, **kwargs)
            flat, out_tree = output_leaves(out, self._sig.fn_name)
            box.append((out_tree, self._out_dims(out, flat), memory_kinds(self.out_shardings, out, "out_shardings")))
            return flat

        mesh, avals = self.mesh, call.avals
        if explicit.typed(mesh):  # inputs typed with their layouts, as jax.jit types them (api/explicit.py)
            avals = explicit.input_types(mesh, avals, self._arg_types(call.leaves), self._in_dims(call))
        with tracing_mesh(mesh), constraint_errors(mesh), scheduled(decision) as found:
            closed, closure = hoist_tracer_consts(jax.make_jaxpr(flat_fn)(*avals))
        out_tree, out_dims, kinds = box[-1]
        if explicit.typed(mesh):  # outputs laid out as their traced types say, as jax.jit returns them
            out_dims = explicit.output_dims(mesh, closed.out_avals, out_dims)
        return closed, closure, out_tree, out_dims, kinds, found

    def _build(self, call: Call) -> _Entry:
        from ..search.tactics import pipeline_decision

        mesh, name = self.mesh, getattr(self.fn, "__name__", None) or type(self.fn).__name__
        in_names = call.names
        in_dims = self._in_dims(call)

        # gp.tactics.pipeline decides the schedule of open gp.pipeline calls: it changes the trace
        closed, closure, out_tree, out_dims, out_kinds, _ = self._trace(call, pipeline_decision(self.tactics, mesh))
        n_c, in_tree = len(closure), call.in_tree
        labels = [f"in_shardings of {nm}" for nm in in_names]
        out_labels = [f"out_shardings of output {i}" for i in range(len(out_dims))]
        leaves, args_tree = None, None
        if self.tactics:
            from ..search.context import Leaf, leaves_of_call

            leaves = [Leaf(None, f"closure{i}", f"closure{i}") for i in range(n_c)] + leaves_of_call(call, in_names)
            tree = jax.tree_util.tree_unflatten(call.in_tree, list(call.avals))
            args_tree = tuple(tree[0] if call.kw_form else tree)
        if n_c:  # closed-over tracers become leading inputs, left open to propagation
            in_names = [f"closure{i}" for i in range(n_c)] + in_names
            in_dims = [None] * n_c + in_dims
            labels = [f"closed-over value {i}" for i in range(n_c)] + labels
            in_tree = jax.tree_util.tree_structure((list(range(n_c)), jax.tree_util.tree_unflatten(
                call.in_tree, [0] * len(call.leaves))))
        donate = tuple(n_c + i for i, d in enumerate(call.donated) if d)
        in_kinds = [None] * n_c + self._in_kinds(call)
        plan = plan_jaxpr(closed, mesh, name=name, in_tree=in_tree, out_tree=out_tree, in_names=in_names,
                          in_dims=in_dims, in_labels=labels, out_dims=out_dims, out_labels=out_labels,
                          donate_argnums=donate, combine_threshold_bytes=self.combine_threshold_bytes,
                          tactics=self.tactics, leaves=leaves, args_tree=args_tree, shaping=self.shaping,
                          out_memory_kinds=out_kinds, in_memory_kinds=in_kinds)
        params = SpmdParams(mesh, name, plan=plan, combine_threshold_bytes=self.combine_threshold_bytes,
                            shaping=self.shaping, in_shardings=_given(in_dims, labels),
                            out_shardings=tuple(Given(d, lab) for d, lab in zip(out_dims, out_labels)))
        return _Entry(closed, plan, params, out_tree, donate, closure)

    def _in_dims(self, call: Call) -> list[Optional[Dims]]:
        """Per dynamic leaf, the canonical dims of its in_sharding (None: open). in_shardings covers
        the positional arguments that are not static, as under jax.jit."""
        if self.in_shardings is None:
            return [None] * len(call.leaves)
        tree = jax.tree_util.tree_unflatten(call.in_tree, list(call.leaves))
        args = tree[0] if call.kw_form else tree
        if call.kw_form and isinstance(self.in_shardings, (tuple, list)) and len(self.in_shardings) != len(args):
            raise ArgumentError(
                f"{self._sig.fn_name}: in_shardings has {len(self.in_shardings)} entries for {len(args)} positional "
                f"arguments; keyword arguments ({', '.join(sorted(tree[1]))}) take none (as under jax.jit): pass "
                f"the sharded arguments positionally")
        n = len(jax.tree_util.tree_leaves(tuple(args)))
        avals, names = call.avals[:n], call.names[:n]
        dims = spec_dims(self.mesh, self.in_shardings, tuple(args), [len(a.shape) for a in avals],
                         [_type_str(a) for a in avals], "in_shardings", names)
        return list(dims) + [None] * (len(call.leaves) - n)

    def _in_kinds(self, call: Call) -> list[Optional[str]]:
        """Per dynamic leaf, the memory kind its in_sharding asks for (a jax NamedSharding's
        ``memory_kind``; None: device memory), as _in_dims reads the specs."""
        if self.in_shardings is None:
            return [None] * len(call.leaves)
        tree = jax.tree_util.tree_unflatten(call.in_tree, list(call.leaves))
        args = tuple(tree[0] if call.kw_form else tree)
        kinds = memory_kinds(self.in_shardings, args, "in_shardings")
        return kinds + [None] * (len(call.leaves) - len(kinds))

    def _out_dims(self, out, flat) -> list[Optional[Dims]]:
        if self.out_shardings is None:
            return [None] * len(flat)
        return spec_dims(self.mesh, self.out_shardings, out, [o.ndim for o in flat], [_type_str(o) for o in flat],
                         "out_shardings", [f"out{i}" for i in range(len(flat))])


def _no_tactics(specs, what: str) -> None:
    """A gp.tactics entry (``res.rules()`` is a tactics list) given as in/out shardings is said as
    such: it belongs in ``tactics=``."""
    from ..search.tactics import TACTICS

    entries = specs if isinstance(specs, (list, tuple)) else [specs]
    if any(isinstance(e, TACTICS) for e in entries):
        raise SpecError(f"gp.spmd: {what} got gp.tactics entries ({', '.join(map(str, entries))}): tactics, and "
                        f"gp.AutoResult.rules()'s list, go in tactics=..., e.g. gp.spmd(fn, mesh, "
                        f"tactics=res.rules()); in_shardings=res.in_shardings for the inputs' specs")


def _given(dims: list[Optional[Dims]], labels: list[str]) -> Optional[tuple]:
    """SpmdParams' in_shardings: per input a Given, or None where it has none (None: no input has one)."""
    given = tuple(None if d is None else Given(d, lab) for d, lab in zip(dims, labels))
    return None if all(g is None for g in given) else given


def _type_str(a) -> str:
    return Value(0, tuple(a.shape), a.dtype).type_str


def spmd(fn: Callable | None = None, mesh: Mesh | None = None, *, in_shardings=None, out_shardings=None,
         static_argnums=(), static_argnames=(), donate_argnums=(), combine_threshold_bytes: Optional[int] = None,
         tactics=None, hardware=None, collective_matmul_bytes: Optional[int] = None):
    """Partition ``fn`` over ``mesh``; usable as ``gp.spmd(fn, mesh, ...)`` or ``@gp.spmd(mesh=mesh, ...)``.

    ``static_argnums``/``static_argnames``/``donate_argnums`` work as jax.jit's.
    ``combine_threshold_bytes``: independent collectives of one kind over the same axes are
    issued as one up to this many bytes (default 30 MiB, as XLA's GPU combiner; 0: never).
    ``tactics``: a list of ``gp.tactics.*`` applied in order at plan time (gspmd_py/search/tactics.py),
    each deciding the shardings over the mesh axes it names.
    ``hardware`` (a gp.Hardware): collectives shaped for it: a reduction over devices that
    span link levels becomes the cheapest reduce-scatter / all-reduce / all-gather program
    over sub-groups (partitioner/hierarchy.py); without it the program is unchanged.
    ``collective_matmul_bytes``: an all-gather feeding a dot, or a dot feeding a
    reduce-scatter, becomes a ring of collective-permutes and partial dots when the looped
    operand reaches this many bytes per device (0: always; None: when ``hardware``'s
    overlapped schedule says it pays, never without one). partitioner/collective_matmul.py.
    """
    if fn is not None and not callable(fn):
        if isinstance(fn, Mesh) and mesh is None:
            fn, mesh = None, fn
        else:
            raise ShardingError(f"gp.spmd: first argument must be the function, got {type(fn).__name__}")
    if mesh is None:
        raise ShardingError("gp.spmd needs mesh=gp.Mesh(...)")
    kw = dict(static_argnums=static_argnums, static_argnames=static_argnames, donate_argnums=donate_argnums,
              combine_threshold_bytes=combine_threshold_bytes, tactics=tactics, hardware=hardware,
              collective_matmul_bytes=collective_matmul_bytes)
    if fn is None:
        return lambda f: Spmd(f, mesh, in_shardings, out_shardings, **kw)
    return Spmd(fn, mesh, in_shardings, out_shardings, **kw)
