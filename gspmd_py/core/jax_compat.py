"""What differs between the JAX releases gspmd_py supports (0.10.2 to the newest), in one place.

gspmd_py reads jaxprs and registers transformation rules for its own primitives, so it
touches a few of JAX's internals that have no public name, and a few whose form changed
between releases. Every such read lives here; no other module imports ``jax._src``.
``PRIVATE`` lists each private name gspmd_py uses, and ``tests/core/test_jax_compat.py``
checks every one of them exists on the JAX it runs under, so a release that moves one
fails that test by name instead of a user's program.

What changed, by release (the functions below read every form):

- scan's parameters: ``num_consts`` / ``num_carry`` (<= 0.10) became the flat trees
  ``ft_in = (consts, carry, xs)`` / ``ft_out = (carry, ys)`` (0.11): ``scan_counts``.
- DCE rules are called ``rule(used_outputs, eqn)`` (<= 0.10) or
  ``rule(used_outputs, live_inputs, eqn)`` (0.12): ``register_dce``.
- ``ClosedJaxpr`` and ``Jaxpr`` are one class in 0.12 (a jaxpr carries its consts):
  ``detach_consts``, ``dce_closed``.
- "hijax" primitives (0.11: ``call_hi_primitive`` from ``jnp.searchsorted``; under
  ``jax_remat3`` / ``jax_custom_vjp3``: ``jax.checkpoint`` and ``custom_vjp``) carry their own
  expansion into ordinary primitives (``to_lojax``): ``is_high`` / ``expand_high`` expand any
  of them, so the next one needs no code here.
- shard_map's parameters: ``in_specs`` / ``out_specs`` / ``newly_manual_axes`` (0.10 to 0.12;
  older: ``in_names`` / ``out_names`` / ``auto``): ``shard_map_specs``, ``shard_map_manual``.
- The differentiated body of a checkpointed loop is staged as ``eval_jaxpr`` (0.12; was
  ``closed_call``): a call like the others (``CALL_PRIMITIVES``).
- The trace context (every option and context JAX keys its own trace cache on: x64, dtype and
  rank promotion, the mesh contexts, ...) is ``jax._src.config.trace_context()`` on every
  release; its members differ (0.12 adds ``jax_custom_jvp3``, ``layout_tracing_mode``, ...), so
  gspmd_py reads the whole tuple, never a list of its own: ``trace_context``,
  ``trace_context_options``.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Sequence

import jax
import jax.extend
from jax._src import core  # noqa: F401  (re-exported: the one place it is imported)
from jax._src import config as jax_config
from jax._src import source_info_util
from jax._src.interpreters import ad, batching, mlir  # noqa: F401
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import ClosedJaxpr, Jaxpr

# Jaxpr and ClosedJaxpr one class (0.12): a jaxpr holds its consts
MERGED_JAXPR: bool = ClosedJaxpr is Jaxpr

# Every private (module, name) gspmd_py reads, checked by tests/core/test_jax_compat.py.
# Optional entries (second tuple) exist only in some releases; gspmd_py works without them.
PRIVATE: tuple[tuple[str, str], ...] = (
    ("jax._src.core", "eval_jaxpr"), ("jax._src.core", "Tracer"), ("jax._src.core", "no_effects"),
    ("jax._src.core", "new_jaxpr_eqn"), ("jax._src.core", "ShapedArray"), ("jax._src.core", "get_axis_env"),
    ("jax._src.core", "NamedAxisEffect"),
    ("jax._src.source_info_util", "summarize"), ("jax._src.source_info_util", "current"),
    ("jax._src.source_info_util", "register_exclusion"), ("jax._src.source_info_util", "user_context"),
    ("jax._src.source_info_util", "current_name_stack"),
    ("jax._src.interpreters.ad", "jvp_jaxpr"), ("jax._src.interpreters.ad", "Zero"),
    ("jax._src.interpreters.ad", "is_undefined_primal"), ("jax._src.interpreters.ad", "UndefinedPrimal"),
    ("jax._src.interpreters.ad", "backward_pass"), ("jax._src.interpreters.ad", "instantiate_zeros"),
    ("jax._src.interpreters.ad", "primitive_jvps"), ("jax._src.interpreters.ad", "primitive_transposes"),
    ("jax._src.interpreters.batching", "batch_jaxpr2"), ("jax._src.interpreters.batching", "fancy_primitive_batchers"),
    ("jax._src.interpreters.mlir", "lower_fun"), ("jax._src.interpreters.mlir", "register_lowering"),
    ("jax._src.interpreters.partial_eval", "JaxprTrace"), ("jax._src.interpreters.partial_eval", "JaxprTracer"),
    ("jax._src.interpreters.partial_eval", "PartialVal"), ("jax._src.interpreters.partial_eval", "new_eqn_recipe"),
    ("jax._src.interpreters.partial_eval", "partial_eval_jaxpr_nounits"),
    ("jax._src.interpreters.partial_eval", "custom_partial_eval_rules"),
    ("jax._src.interpreters.partial_eval", "partial_eval_jaxpr_custom_rules"),
    ("jax._src.interpreters.partial_eval", "closed_call_partial_eval_custom_rule"),
    ("jax._src.interpreters.partial_eval", "dce_jaxpr"), ("jax._src.interpreters.partial_eval", "dce_rules"),
    ("jax._src.interpreters.partial_eval", "convert_constvars_jaxpr"),
    ("jax._src.interpreters.partial_eval", "prune_closed_jaxpr_outputs"),
    ("jax._src.dispatch", "runtime_tokens"),
    ("jax._src.lax.lax", "_convert_element_type"),
    ("jax._src.config", "trace_context"), ("jax._src.config", "trace_context_names"),
    ("jax._src.distributed", "global_state"),
)

# Calls the tracer inlines whatever their name: the parameter holding the callee's jaxpr
CALL_PARAMS: tuple[str, ...] = ("jaxpr", "call_jaxpr", "fun_jaxpr")
CALL_PRIMITIVES: frozenset[str] = frozenset({
    "jit", "pjit", "closed_call", "core_call", "eval_jaxpr", "remat", "remat2", "checkpoint", "custom_jvp_call",
    "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin", "named_call", "call",
    "composite"})  # composite (lax.composite): its decomposition ("jaxpr"; 0.12: "call_jaxpr")


def missing_private() -> list[str]:
    """Each entry of ``PRIVATE`` this JAX does not have, as "module.name"."""
    out = []
    for mod, name in PRIVATE:
        try:
            m = importlib.import_module(mod)
        except ImportError:
            out.append(f"{mod}.{name}")
            continue
        if not hasattr(m, name):
            out.append(f"{mod}.{name}")
    return out


# -- the trace context ----------------------------------------------------------------------------
def trace_context() -> tuple:
    """What JAX keys its own trace cache on (jax.jit re-traces when any of it changes): the value of
    every configuration option registered as part of the trace context (``jax_enable_x64``,
    ``jax_numpy_dtype_promotion``, ``jax_numpy_rank_promotion``, ``jax_threefry_partitionable``,
    ...) and the mesh / compute-on / axis-environment contexts. A hashable tuple, cheap to take
    (about 0.1-0.3 us); gp.spmd's plan caches key on it."""
    return jax_config.trace_context()


def trace_context_options() -> dict[str, Any]:
    """The configuration options in this JAX's trace context, name -> current value (the contexts
    that are not options, such as the mesh context, are left out)."""
    holders = jax.config._value_holders
    return {n: holders[n].value for n in jax_config.trace_context_names() if n in holders}


def trace_option(name: str, value):
    """A context manager setting trace-context option ``name`` to ``value`` (restored on exit), as
    ``jax.config.update`` would for the options it knows by name."""
    return jax.config._value_holders[name](value)


def weakly_typed(x):
    """``x`` (inside a trace) with a weak type, as a Python scalar's result has (``~float32[]``): a
    no-op convert_element_type, which jax.jit's outputs carry into their arrays' types."""
    from jax._src.lax import lax as lax_internal

    return lax_internal._convert_element_type(x, x.dtype, weak_type=True)


def memory_kind(aval) -> Optional[str]:
    """The memory kind a value of type ``aval`` lives in when it leaves a jit: "pinned_host" for
    a host-memory type (``f32<host>[4]``: a ``jax.device_put`` to pinned host memory or
    ``jax.memory.Space.Host`` inside the function), None for device memory (``memory_space``:
    jax >= 0.10's types; absent: device)."""
    space = getattr(aval, "memory_space", None)
    return "pinned_host" if getattr(space, "name", None) == "Host" else None


# -- loops -------------------------------------------------------------------------------------
def scan_counts(params: dict) -> tuple[int, int]:
    """(number of consts, number of carries) of a scan equation's parameters; the rest of its
    operands are the scanned xs."""
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(consts), len(carry)


# -- shard_map ---------------------------------------------------------------------------------------
def shard_map_specs(params: dict) -> tuple[tuple, tuple]:
    """(in specs, out specs) of a ``shard_map`` equation: PartitionSpecs (``in_specs`` /
    ``out_specs``, 0.10 to 0.12), or the older ``in_names`` / ``out_names`` (per operand a dict
    dim -> axes), as they are."""
    ins = params["in_specs"] if "in_specs" in params else params["in_names"]
    outs = params["out_specs"] if "out_specs" in params else params["out_names"]
    return tuple(ins), tuple(outs)


def shard_map_manual(params: dict, names: Sequence[str]) -> tuple[str, ...]:
    """The manual axes of a ``shard_map`` equation over a mesh of axes ``names``, in mesh order:
    ``newly_manual_axes`` (0.10 to 0.12), ``manual_axes``, or every axis but ``auto`` (older)."""
    for key in ("newly_manual_axes", "manual_axes"):
        if params.get(key) is not None:
            chosen = set(params[key])
            return tuple(n for n in names if n in chosen)
    auto = set(params.get("auto") or ())
    return tuple(n for n in names if n not in auto)


# -- jaxprs ------------------------------------------------------------------------------------
def open_jaxpr(j) -> tuple[Any, list]:
    """(jaxpr, consts) of a Jaxpr or ClosedJaxpr, as an open jaxpr and the values of its constvars."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def detach_consts(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with its consts turned into leading inputs (no consts left)."""
    if MERGED_JAXPR:
        return pe.convert_constvars_jaxpr(closed)
    return ClosedJaxpr(pe.convert_constvars_jaxpr(closed.jaxpr), [])


def dce_closed(closed: ClosedJaxpr, used_outputs: Sequence[bool]) -> tuple[ClosedJaxpr, list[bool]]:
    """``closed`` without what the unused outputs need, and which inputs it still uses."""
    if MERGED_JAXPR:
        new, used_inputs = pe.dce_jaxpr(closed, list(used_outputs))
        return new, list(used_inputs)
    new, used_inputs = pe.dce_jaxpr(closed.jaxpr, list(used_outputs))
    return ClosedJaxpr(new, closed.consts), list(used_inputs)


def prune_outputs(closed: ClosedJaxpr, keep: Sequence[bool]) -> ClosedJaxpr:
    """``closed`` returning only the outputs whose ``keep`` is true (its inputs unchanged)."""
    return pe.prune_closed_jaxpr_outputs(closed, list(keep))


def eval_closed(closed: ClosedJaxpr, *args) -> list:
    """Evaluate ``closed`` op by op on ``args``."""
    return core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def register_dce(prim, rule: Callable) -> None:
    """Register ``rule(used_outputs, eqn) -> (used_inputs, new_eqn)`` as ``prim``'s DCE rule,
    whatever arguments this JAX passes (0.12 passes the live inputs in between)."""
    pe.dce_rules[prim] = lambda used_outputs, *rest: rule(used_outputs, rest[-1])


# -- hijax primitives -----------------------------------------------------------------------------
def is_high(eqn) -> bool:
    """Whether ``eqn``'s primitive is a "hijax" one that expands into ordinary primitives."""
    check = getattr(eqn.primitive, "is_high", None)
    if check is None or not callable(check):
        return False
    try:
        return bool(check(*[v.aval for v in eqn.invars], **eqn.params))
    except TypeError:  # a primitive whose is_high takes no arguments (older form)
        return False


def expand_high(eqn) -> ClosedJaxpr:
    """The jaxpr of a hijax equation's expansion into ordinary primitives (its ``to_lojax``),
    taking the equation's operands and returning its results."""
    prim, params = eqn.primitive, eqn.params

    def expanded(*xs):
        out = prim.to_lojax(*xs, **params)
        return list(out) if prim.multiple_results else [out]

    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=getattr(v.aval, "weak_type", False))
             for v in eqn.invars]
    return jax.make_jaxpr(expanded)(*avals)


# -- source locations ------------------------------------------------------------------------------
def source_summary(source_info) -> str:
    """"file:line (function)" of an equation's source, or "" when JAX cannot say."""
    try:
        return source_info_util.summarize(source_info)
    except Exception:  # pragma: no cover - best effort only
        return ""


def current_source():
    return source_info_util.current()


def exclude_from_tracebacks(path: str) -> None:
    """Frames under ``path`` are not the user's: source locations skip them."""
    try:
        source_info_util.register_exclusion(path)
    except Exception:  # pragma: no cover - messages just name an inner frame then
        pass


# -- optional internals: each has a fallback -------------------------------------------------------
def threefry2x32_p():
    """JAX's threefry2x32 primitive (None where this JAX has none)."""
    return getattr(jax.extend.random, "threefry2x32_p", None)


def key_wrap(keys) -> tuple[ClosedJaxpr, Any]:
    """(the jaxpr that makes key arrays like ``keys`` from their key data, that key data): JAX's own
    ``jax.random.wrap_key_data`` traced."""
    data = jax.random.key_data(keys)
    impl = jax.random.key_impl(keys)
    closed = jax.make_jaxpr(lambda d: jax.random.wrap_key_data(d, impl=impl))(
        jax.ShapeDtypeStruct(data.shape, data.dtype))
    return closed, data


def runtime_tokens() -> dict:
    """JAX's per-device runtime tokens of the last computation with host callbacks ({} if unknown)."""
    try:
        from jax._src import dispatch

        return dispatch.runtime_tokens.output_runtime_tokens
    except Exception:  # pragma: no cover - another jax
        return {}


def distributed_client():
    """The jax.distributed key-value client, or None when not initialised."""
    try:
        from jax._src.distributed import global_state
    except ImportError:  # pragma: no cover
        return None
    return global_state.client
