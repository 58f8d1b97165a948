"""``assert_spmd_equivalent``: a function partitioned by gp.spmd computes what its reference computes,
over meshes, shardings, shapes and values drawn by Hypothesis.

    gpt.assert_spmd_equivalent(fn, x, w)                        # everything drawn
    gpt.assert_spmd_equivalent(fn, x, w, mesh=mesh, in_shardings=(gp.P("x", None), None))
    gpt.assert_spmd_equivalent(fn, x, w, reference="jax.jit")   # differential: XLA's own partitioner
    gpt.assert_spmd_equivalent(gpt.programs(), max_examples=500)  # random programs (fn: a strategy)

Per example: a mesh (``mesh``: a gp.Mesh, a list of them, a strategy, or None: ``gpt.meshes()``
over the axis names ``in_shardings`` uses), shapes like ``example_args`` (``gpt.shapes_like``;
``vary_shapes=False`` keeps them), values (``gpt.arrays``: plain, with +-0, +-inf, NaN, and
values near the dtype's max where the function only moves data), in_shardings (given, or drawn
per argument: ``gpt.shardings`` or None). gp.spmd(fn) runs, and the reference: ``None`` fn
itself unpartitioned (jax.jit on one device), ``"jax.jit"`` jax.jit with the same NamedShardings
(uneven dims placed by with_sharding_constraint), or a callable. ``also_grad`` compares the
gradients of the sum of the float outputs, ``also_vmap`` the function under jax.vmap.
Comparison: compare.py (bit-exact where nothing rounds; floats within a tolerance from the
dtype and the reduction sizes). A failure is shrunk by Hypothesis to the smallest mesh, shape
and sharding, and raised as an AssertionError holding a standalone reproducer script and the
``plan.explain`` chain of the first differing output. A crash of gp.spmd is a failure too.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from ..core import dtypes
from ..api.api import spmd
from ..core.errors import ArgumentTypeError
from ..core.mesh import Mesh
from ..core.sharding import entry_axes
from . import compare
from .reproducer import script
from .strategies import arrays, meshes, shapes_like, shardings

MODES = ("value", "grad", "vmap")


# -- the reference under jax.jit with the same shardings ----------------------------------------

def _axis_names(mesh: Mesh, specs) -> set:
    used = set()
    for s in jax.tree_util.tree_leaves(specs, is_leaf=lambda x: x is None or _is_spec(x)):
        if s is not None:
            for e in s:
                if e is not None and e != "?":
                    used.update(str(a) for a in entry_axes(e))
    return used


def _is_spec(x) -> bool:
    return type(x).__name__ in ("P", "PartitionSpec")


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def _jax_mesh(mesh: Mesh, specs):
    """A jax Mesh for ``mesh``: its own axes, or (when a spec names sub-axes) every axis of size
    2^k split into k axes of size 2 ("y#0", "y#1", major first) so each sub-axis has a name."""
    if not any(":" in a for a in _axis_names(mesh, specs)):
        return jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names), False
    names, sizes = [], []
    for a, n in zip(mesh.axis_names, mesh.shape):
        if not _pow2(n):  # only power-of-2 axes have sub-axes (gpt.shardings splits those)
            names.append(a)
            sizes.append(n)
            continue
        k = int(n).bit_length() - 1
        names += [f"{a}#{i}" for i in range(k)]
        sizes += [2] * k
    return jax.sharding.Mesh(mesh.jax_devices().reshape(sizes), tuple(names)), True


def _jax_spec(mesh: Mesh, spec, rank: int, bits: bool):
    from jax.sharding import PartitionSpec as JP

    out = []
    for e in list(spec or ()) + [None] * (rank - len(spec or ())):
        if e is None:
            out.append(None)
            continue
        names = []
        for a in entry_axes(e):
            r = mesh.ref(a)
            if not bits or not _pow2(mesh.axis_size(r.name)):
                if r.size != mesh.axis_size(r.name):
                    raise ValueError(f"reference='jax.jit': sub-axis {a} of an axis of size "
                                     f"{mesh.axis_size(r.name)} has no jax name")
                names.append(r.name)
                continue
            start = r.pre.bit_length() - 1
            names += [f"{r.name}#{start + i}" for i in range(r.size.bit_length() - 1)]
        out.append(tuple(names) if names else None)
    return JP(*out)


def jit_reference(fn: Callable, mesh: Mesh, in_shardings) -> Callable:
    """``fn`` under jax.jit with its inputs placed as ``in_shardings`` (a spec per argument, or a
    pytree prefix of specs) by with_sharding_constraint (so uneven dims are allowed): XLA's own
    partitioned result, for a differential test."""
    from jax.sharding import NamedSharding

    jm, bits = _jax_mesh(mesh, in_shardings)

    def constrained(*xs):
        specs = in_shardings if isinstance(in_shardings, (tuple, list)) else (in_shardings,) * len(xs)
        placed = []
        for x, s in zip(xs, specs):
            def put(leaf, spec):
                if spec is None:
                    return leaf
                return jax.lax.with_sharding_constraint(leaf, NamedSharding(jm, _jax_spec(mesh, spec, leaf.ndim, bits)))
            if s is None or _is_spec(s):
                placed.append(jax.tree_util.tree_map(lambda leaf: put(leaf, s), x))
            else:
                placed.append(jax.tree_util.tree_map(put, x, s, is_leaf=lambda v: v is None or _is_spec(v)))
        return fn(*placed)

    return jax.jit(constrained)


# -- modes: the value, its gradient, its vmap --------------------------------------------------

def _float_args(args) -> tuple[int, ...]:
    return tuple(i for i, a in enumerate(args)
                 if jax.tree_util.tree_leaves(a) and all(dtypes.is_float(np.asarray(x).dtype)
                                                          for x in jax.tree_util.tree_leaves(a)))


def _sum_floats(out):
    leaves = [o for o in jax.tree_util.tree_leaves(out) if dtypes.is_float(jnp.result_type(o))]
    return sum((jnp.sum(o.astype(jnp.float32)) for o in leaves), jnp.float32(0))


def _batched(args):
    """Two examples per argument: the argument and its elements reversed (a second, different one)."""
    return jax.tree_util.tree_map(lambda a: np.stack([np.asarray(a), np.asarray(a).reshape(-1)[::-1].reshape(np.shape(a))]), args)


def apply_mode(mode: str, f: Callable, args, trace: bool = False):
    """``f`` on ``args`` as the check ``mode`` runs it ("value", "grad": the gradient of the sum of
    the float outputs w.r.t. the float arguments, "vmap": over two stacked examples); with
    ``trace`` the jaxpr of that computation instead of its result."""
    args = tuple(args)
    if mode == "value":
        g, a = f, args
    elif mode == "grad":
        nums = _float_args(args)
        g, a = jax.grad(lambda *xs: _sum_floats(f(*xs)), argnums=nums), args
    elif mode == "vmap":
        g, a = jax.vmap(f), _batched(args)
    else:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    return jax.make_jaxpr(g)(*a) if trace else g(*a)


def compare_trees(got, want, closed_jaxpr, args, tol: Any = "auto", intermediates: bool = True) -> list[str]:
    """What differs between ``got`` and ``want`` (empty: nothing), output by output."""
    gl, gt = jax.tree_util.tree_flatten(got)
    wl, wt = jax.tree_util.tree_flatten(want)
    if gt != wt:
        return [f"the outputs' structure differs: got {gt}, want {wt}"]
    analysis = compare.analyze(closed_jaxpr)
    scale = compare.finite_scale(jax.tree_util.tree_leaves(args) + wl)
    problems = []
    for i, (g, w) in enumerate(zip(gl, wl)):
        w = np.asarray(w)
        rtol = (compare.float_factor(analysis) * compare.eps(w.dtype) if tol == "auto" else float(tol)) \
            if dtypes.is_inexact(w.dtype) else 0.0  # complex too: eps of its parts
        d, _ = compare.diff(g, w, analysis.exactness, rtol, scale)
        if d and intermediates and analysis.exactness == compare.INEXACT and dtypes.is_inexact(w.dtype):
            try:  # the magnitudes inside the computation bound a reordered sum's error too
                inner = compare.intermediates(closed_jaxpr, jax.tree_util.tree_leaves(args))
                d, _ = compare.diff(g, w, analysis.exactness, rtol, max(scale, compare.finite_scale(inner)))
            except Exception:  # noqa: BLE001 - the op-by-op evaluation is only a refinement
                pass
        if d:
            how = compare.EXACTNESS_NAMES[analysis.exactness if dtypes.is_inexact(w.dtype) else compare.EXACT]
            tol_s = f", rtol {rtol:.3g} of |want| + {scale:.3g}" if how == "within tolerance" else ""
            problems.append(f"output {i} {dtypes.short_name(w.dtype)}{list(w.shape)} ({how}{tol_s}): {d}")
    return problems


def fn_name(fn) -> str:
    return getattr(fn, "gpt_name", None) or getattr(fn, "__name__", None) or type(fn).__name__


# -- one drawn example -------------------------------------------------------------------------

@attrs.frozen(repr=False)
class Case:
    """One example: a function ``fn``, a ``mesh``, its ``args`` and their ``in_shardings``."""

    fn: Callable
    mesh: Mesh
    args: tuple
    in_shardings: Any

    def __repr__(self) -> str:
        shapes = ", ".join(f"{dtypes.short_name(np.asarray(a).dtype)}{list(np.shape(a))}"
                           for a in jax.tree_util.tree_leaves(self.args))
        ids = self.mesh.device_ids.reshape(-1).tolist()
        return (f"Case({fn_name(self.fn)} on {self.mesh} devices {ids}, args [{shapes}], "
                f"in_shardings {self.in_shardings!r})")


def _mesh_strategy(mesh, in_shardings):
    if isinstance(mesh, Mesh):
        return st.just(mesh)
    if isinstance(mesh, (list, tuple)):
        return st.sampled_from(list(mesh))
    if mesh is not None:
        return mesh
    if in_shardings is None:
        return meshes()
    names = sorted({a.split(":")[0] for a in _axis_names(None, in_shardings)})
    if not names:
        return meshes()
    return meshes(max_axes=len(names), axis_names=names).filter(lambda m: len(m.axis_names) == len(names))


def _value_modes(fn, example_args) -> tuple[str, ...]:
    try:
        a = compare.analyze(jax.make_jaxpr(fn)(*example_args))
    except Exception:  # noqa: BLE001 - the example may not trace; the draws decide
        return ("plain", "special")
    return ("plain", "special", "near_max") if a.exactness != compare.INEXACT else ("plain", "special")


@st.composite
def cases(draw, fn, example_args: tuple, *, mesh=None, in_shardings=None, vary_shapes: Any = True,
          value_modes: Optional[Sequence[str]] = None):
    """Examples for assert_spmd_equivalent (see the module doc): a ``Case`` per draw. A drawn ``fn``
    (``fn`` a strategy) that has ``gpt_case()`` (a ``gpt.Program``) brings its own mesh,
    arguments and in_shardings."""
    f = draw(fn) if isinstance(fn, st.SearchStrategy) else fn
    if hasattr(f, "gpt_case"):
        m, args, specs = f.gpt_case()
        return Case(f, m, tuple(args), specs)
    m = draw(_mesh_strategy(mesh, in_shardings))
    structs = draw(shapes_like(tuple(example_args), vary=vary_shapes)) if vary_shapes is not False else \
        jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a)), tuple(example_args))
    try:
        jax.eval_shape(f, *structs)
    except Exception:  # noqa: BLE001 - these sizes do not fit the function (a fixed reshape, say)
        reject()
    modes = tuple(value_modes) if value_modes is not None else _value_modes(f, example_args)
    args = jax.tree_util.tree_map(lambda s: draw(arrays(s.shape, s.dtype, modes=modes)), structs)
    if in_shardings is None:
        specs = tuple(jax.tree_util.tree_map(
            lambda s: draw(st.one_of(st.none(), shardings(s.shape, m))), a) for a in structs)
    else:
        specs = in_shardings
    return Case(f, m, tuple(args), specs)


def _check_specs(mesh: Mesh, in_shardings, args: tuple) -> None:
    """The user's in_shardings against the example arguments: a spec that names no axis of the
    mesh or does not fit its tensor is the caller's SpecError, raised here, never an
    "inequivalence" found on a shrunk example."""
    from ..frontend.specs import spec_dims

    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(args)[0]) if jax.tree_util.tree_leaves(args) \
        else ((), ())
    spec_dims(mesh, in_shardings, args, [np.ndim(a) for a in leaves],
              [f"{jnp.result_type(a)}{list(np.shape(a))}" for a in leaves], "in_shardings",
              [f"arg{p[0].idx}{jax.tree_util.keystr(p[1:])}" for p in paths])


def _key(case: Case):
    try:
        hash(case.fn)
        fn_key = case.fn  # held by the cache: its id cannot be reused while the cache lives
    except TypeError:
        fn_key = (id(case.fn), case.fn.__class__)
    return (fn_key, case.mesh, repr(case.in_shardings))


def _run_gp(case: Case, mode: str, cache: Optional[dict]):
    """gp.spmd(fn) on the case; ``cache`` (one per assertion) keeps the gp.spmd function per (fn,
    mesh, in_shardings), so that examples differing only in values (most of shrinking) reuse its plan."""
    key = _key(case)
    f = cache.get(key) if cache is not None else None
    if f is None:
        f = spmd(case.fn, case.mesh, in_shardings=case.in_shardings)
        if cache is not None:
            cache[key] = f
    return f, apply_mode(mode, f, case.args)


def _reference_fn(case: Case, reference):
    if reference is None:
        return jax.jit(case.fn)
    if isinstance(reference, str):
        if reference != "jax.jit":
            raise ValueError(f"reference={reference!r}: use None (fn unpartitioned), 'jax.jit' or a callable")
        return jit_reference(case.fn, case.mesh, case.in_shardings)
    return reference


def _digest(args) -> tuple:
    """The inputs' identity: shapes, dtypes and bytes (two draws of one seed are one input)."""
    import hashlib

    h = hashlib.sha1()
    for a in jax.tree_util.tree_leaves(args):
        a = np.asarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).view(np.uint8).tobytes() if a.dtype != object else repr(a).encode())
    return (jax.tree_util.tree_structure(args), h.hexdigest())


def _reference(case: Case, mode: str, ref, cache: Optional[dict]):
    """The reference's result on the case's inputs and the traced computation the comparison
    reads: once per input and mode (``cache``: shrinking and repeated draws meet the same inputs
    again), the trace once per input shapes (it depends on nothing else)."""
    if cache is None:
        return apply_mode(mode, ref, case.args), apply_mode(mode, case.fn, case.args, trace=True)
    avals = tuple((np.shape(a), str(np.asarray(a).dtype)) for a in jax.tree_util.tree_leaves(case.args))
    tkey = ("trace", _key(case)[0], mode, jax.tree_util.tree_structure(case.args), avals)
    trace = cache.get(tkey)
    if trace is None:
        trace = cache[tkey] = apply_mode(mode, case.fn, case.args, trace=True)
    wkey = ("want", _key(case), mode, _digest(case.args))
    want = cache.get(wkey)
    if want is None:
        want = cache[wkey] = apply_mode(mode, ref, case.args)
    return want, trace


def _explain(f, case: Case, i: int) -> str:
    try:
        plan = f.plan(*case.args)
        return plan.explain(f"out{i}")
    except Exception as e:  # noqa: BLE001 - the message is still useful without it
        return f"(plan.explain unavailable: {type(e).__name__}: {e})"


def check_case(case: Case, *, reference=None, modes: Sequence[str] = ("value",), tol: Any = "auto",
               cache: Optional[dict] = None) -> Optional[str]:
    """None when gp.spmd(fn) matches the reference on ``case`` in every mode; else the failure message.
    ``cache`` (one per assertion): the gp.spmd function per (fn, mesh, in_shardings), so its plan
    and executable per input shapes are built once; the reference function, its result per input
    and the traced computation per input shapes, each computed once."""
    ref = _reference_fn(case, reference) if cache is None else \
        cache.setdefault(("reference", _key(case)), _reference_fn(case, reference))
    ref_name = "fn unpartitioned" if reference is None else "jax.jit with the same shardings" \
        if isinstance(reference, str) else f"reference {getattr(reference, '__name__', reference)!r}"
    for mode in modes:
        if mode == "grad" and not _float_args(case.args):
            continue
        try:
            want, trace = _reference(case, mode, ref, cache)
        except Exception:  # noqa: BLE001 - the reference cannot run this example: not a gp failure
            reject()
        f = None
        try:
            f, got = _run_gp(case, mode, cache)
            problems = compare_trees(got, want, trace, case.args, tol)
        except Exception as e:  # noqa: BLE001 - a crash of gp.spmd is a failure, with its reproducer
            problems = [f"gp.spmd raised {type(e).__name__}: {str(e)[:2000]}"]
        if problems:
            return _message(case, mode, ref_name, reference, problems, f, tol)
    return None


def _message(case: Case, mode: str, ref_name: str, reference, problems, f, tol) -> str:
    try:
        jaxpr = jax.make_jaxpr(case.fn)(*case.args)
        n_ops = compare.count_ops(jaxpr)
        jtext = str(jaxpr)
    except Exception:  # noqa: BLE001
        n_ops, jtext = -1, None
    first = next((int(p.split()[1]) for p in problems if p.startswith("output ")), None)
    ids = case.mesh.device_ids.reshape(-1).tolist()
    summary = (f"gp.spmd({fn_name(case.fn)}) differs from {ref_name}"
               + (f" under {mode}" if mode != "value" else "")
               + f" on {case.mesh} (devices {ids}), {n_ops} op(s)")
    lines = [summary + ":", f"  in_shardings: {case.in_shardings!r}",
             "  inputs: " + ", ".join(f"{dtypes.short_name(np.asarray(a).dtype)}{list(np.shape(a))}"
                                     for a in jax.tree_util.tree_leaves(case.args))]
    lines += ["  " + p for p in problems]
    if first is not None and f is not None and mode == "value":
        lines += [f"why out{first} is laid out as it is (plan.explain):",
                  "  " + _explain(f, case, first).replace("\n", "\n  ")]
    lines += ["reproducer (a standalone script):", "-" * 72,
              script(case.fn, case.mesh, case.args, case.in_shardings, mode=mode, reference=reference, tol=tol,
                     jaxpr=jtext, summary=summary), "-" * 72]
    return "\n".join(lines)


def assert_spmd_equivalent(fn, *example_args, mesh=None, in_shardings=None, reference=None, also_grad: bool = False,
                           also_vmap: bool = False, tol: Any = "auto", max_examples: int = 100,
                           vary_shapes: Any = True, value_modes: Optional[Sequence[str]] = None,
                           seed: Optional[int] = None) -> None:
    """Assert that gp.spmd(fn) computes what ``reference`` computes over drawn examples (module doc).

    Raises AssertionError (after Hypothesis shrank the example) with a reproducer script. Extra
    keywords: ``vary_shapes`` (True, False, or the indices of the arguments whose shapes are
    drawn), ``value_modes`` (of "plain", "special", "near_max"), ``seed`` (derandomize with it).
    """
    if tol != "auto" and not isinstance(tol, (int, float)):
        raise ArgumentTypeError(f"assert_spmd_equivalent: tol must be 'auto' or a number, got {tol!r}")
    if not isinstance(fn, st.SearchStrategy) and not callable(fn):
        raise ArgumentTypeError(f"assert_spmd_equivalent: fn must be callable (or a strategy of callables), got "
                                f"{type(fn).__name__}")
    if not isinstance(fn, st.SearchStrategy):
        try:
            jax.eval_shape(fn, *example_args)
        except Exception as e:  # noqa: BLE001 - said plainly instead of as an unsatisfiable search
            raise TypeError(f"assert_spmd_equivalent: {getattr(fn, '__name__', fn)} does not run on its example "
                            f"arguments: {type(e).__name__}: {e}") from e
    if in_shardings is not None and isinstance(mesh, Mesh) and not isinstance(fn, st.SearchStrategy):
        _check_specs(mesh, in_shardings, tuple(example_args))
    modes = ("value",) + (("grad",) if also_grad else ()) + (("vmap",) if also_vmap else ())
    strategy = cases(fn, tuple(example_args), mesh=mesh, in_shardings=in_shardings, vary_shapes=vary_shapes,
                     value_modes=value_modes)
    conf = settings(settings.default, max_examples=max_examples, deadline=None, report_multiple_bugs=False,
                    database=None, derandomize=settings.default.derandomize if seed is None else False,
                    suppress_health_check=list(HealthCheck))

    cache: dict = {}

    @conf
    @given(strategy)
    def spmd_equivalent(case):
        msg = check_case(case, reference=reference, modes=modes, tol=tol, cache=cache)
        if msg:
            raise AssertionError(msg)

    if seed is not None:
        from hypothesis import seed as hseed

        spmd_equivalent = hseed(seed)(spmd_equivalent)
    spmd_equivalent()
