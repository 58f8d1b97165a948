"""How a gp.spmd function takes its arguments, as jax.jit does: static and keyword arguments,
array leaves named by their pytree path, and clear errors for what cannot be an argument.

    >>> sig = Signature.of(fn, static_argnums=(1,), static_argnames=("act",))
    >>> call = sig.bind((x, 4), {"act": "gelu", "w": w})   # fn(x, n, *, act, w)
    >>> call.names                # leaves named by key path, as the plan names its inputs
    ['arg0', 'w']
    >>> args, kwargs = call.rebuild(call.leaves)         # statics put back: (x, 4), {"act": ..., "w": w}

Static values are part of the plan cache key (``call.key``); dynamic leaves are arrays,
Python scalars (weakly typed, as under jax.jit) or tracers; ``jax.ShapeDtypeStruct``
leaves are accepted only where no data is needed (``f.plan``).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import attrs
import jax
import numpy as np
from jax import core as jcore

from ..core.errors import ArgumentError, ArgumentTypeError, DeletedArrayError, short_repr
from ..runtime.placed import logical_shape

_SCALARS = (bool, int, float, complex)


@attrs.frozen
class Signature:
    """Which arguments of ``fn`` are static (by position and by name) and which are donated."""

    fn_name: str
    params: tuple[str, ...]  # names of fn's positional parameters, in order ("" where unknown)
    static_argnums: frozenset[int]
    static_argnames: frozenset[str]
    donate_argnums: frozenset[int]

    @classmethod
    def of(cls, fn: Callable, static_argnums=(), static_argnames=(), donate_argnums=()) -> "Signature":
        nums = _ints(static_argnums, "static_argnums")
        names = _strs(static_argnames, "static_argnames")
        donate = _ints(donate_argnums, "donate_argnums")
        params: tuple[str, ...] = ()
        out_of_range: list[int] = []
        unknown: list[str] = []
        takes: list[str] = []
        bad_donate: list[int] = []
        try:
            ps = list(inspect.signature(fn).parameters.values())
            params = tuple(p.name if p.kind == p.POSITIONAL_OR_KEYWORD else "" for p in ps
                           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
            by_name = {p.name: i for i, p in enumerate(ps) if p.kind == p.POSITIONAL_OR_KEYWORD}
            takes = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            if not any(p.kind == p.VAR_KEYWORD for p in ps):  # as jax.jit: a name fn does not take is an error
                unknown = sorted(names - set(takes))
            # as jax.jit: a static position is static by name too, and the other way round
            if not any(p.kind == p.VAR_POSITIONAL for p in ps):  # as jax.jit: out of range is an error
                out_of_range = sorted(i for i in nums if not -len(params) <= i < len(params))
                bad_donate = sorted(i for i in donate if not -len(params) <= i < len(params))
            nums |= {by_name[n] for n in names if n in by_name}
            names |= {params[i] for i in nums if 0 <= i < len(params) and params[i] in by_name}
        except (TypeError, ValueError):  # builtins and some C callables have no signature
            pass
        if unknown:
            raise ArgumentError(f"{_name(fn)}: static_argnames {unknown} name no parameter of it (as jax.jit says: "
                                f"invalid argnames); the names it takes are {takes}")
        if out_of_range:
            raise ArgumentError(f"{_name(fn)}: static_argnums {out_of_range} out of range: it takes "
                                f"{len(params)} positional argument(s)")
        if bad_donate:
            raise ArgumentError(f"{_name(fn)}: donate_argnums {bad_donate} out of range: it takes "
                                f"{len(params)} positional argument(s)")
        if nums & donate:
            raise ArgumentError(f"{_name(fn)}: arguments {sorted(nums & donate)} are both static and donated")
        return cls(_name(fn), params, frozenset(nums), frozenset(names), frozenset(donate))

    @staticmethod
    def name(i: int) -> str:
        """Positional argument ``i`` as ``plan.sharding_of`` names it (``arg1``)."""
        return f"arg{i}"

    # positional-only parameters are kept as "" in ``params``: a keyword cannot name them

    def bind(self, args: Sequence[Any], kwargs: dict, *, plan_only: bool = False) -> "Call":
        n_given = len(args)
        if kwargs and len(args) < len(self.params) and self.params[len(args)] in kwargs:
            # keywords naming the next positional parameters are positional: f(x, w=w) is f(x, w)
            args, kwargs = list(args), dict(kwargs)
            while len(args) < len(self.params) and self.params[len(args)] in kwargs:
                args.append(kwargs.pop(self.params[len(args)]))
        n = len(args)
        # how the caller named each positional argument (messages say "w" for one passed as w=...)
        said = lambda i: self.params[i] if i >= n_given else self.name(i)
        static_pos = tuple(sorted({i % n for i in self.static_argnums if -n <= i < n}))
        if static_pos or self.static_argnames:
            dyn_args = tuple(a for i, a in enumerate(args) if i not in static_pos)
            dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
            statics = tuple((i, args[i]) for i in static_pos) + tuple(
                sorted(((k, v) for k, v in kwargs.items() if k in self.static_argnames), key=lambda kv: kv[0]))
        else:
            dyn_args, dyn_kwargs, statics = tuple(args), kwargs, ()
        for where, value in statics:
            what = said(where) if isinstance(where, int) else where
            if isinstance(value, jcore.Tracer):
                raise ArgumentError(
                    f"{self.fn_name}: static argument {what} is traced by an enclosing transformation: mark it "
                    f"static there too (e.g. jax.jit(f, static_argnums=...)), or pass a Python value")
            try:
                hash(value)
            except TypeError:
                raise ArgumentError(
                    f"{self.fn_name}: static argument {what} is a {type(value).__name__}, which is not hashable: "
                    f"pass a hashable value (a tuple, a frozen dataclass) or make it an array argument") from None
        leaves, in_tree = jax.tree_util.tree_flatten((dyn_args, dyn_kwargs) if dyn_kwargs else dyn_args)
        return Call(self, static_pos, statics, in_tree, leaves, n, bool(dyn_kwargs), plan_only, n_given)


class Call:
    """One call's arguments: dynamic leaves (their avals, and labels for messages) and static values."""

    def __init__(self, sig: Signature, static_pos: tuple[int, ...], statics: tuple, in_tree, leaves: list,
                 n_args: int, kw_form: bool, plan_only: bool, n_given: int):
        self.sig, self.static_pos, self.statics, self.in_tree = sig, static_pos, statics, in_tree
        self.leaves, self.n_args, self.kw_form = leaves, n_args, kw_form  # kw_form: in_tree is (args, kwargs)
        self.n_given = n_given  # positional arguments as given; the rest were passed by keyword
        self._paths_cache: list[tuple[str, str, bool]] | None = None
        self.avals = [_aval(x, i, self, plan_only) for i, x in enumerate(leaves)]

    @property
    def key(self):
        return (self.in_tree, tuple((a.shape, a.dtype, a.weak_type) for a in self.avals), self.statics, self.n_args)

    @property
    def traced(self) -> bool:
        return any(isinstance(x, jcore.Tracer) for x in self.leaves)

    @property
    def names(self) -> list[str]:
        """Each leaf named by its key path, as the plan names its inputs: "arg0", "arg1['w']"
        (positional: by position in the call, statics counted), "opts['lr']" (keyword)."""
        return [nm for nm, _, _ in self._paths()]

    @property
    def labels(self) -> list[str]:
        """Each leaf named for messages: as ``names``, but a positional argument passed by keyword
        under its keyword ("w['kernel']")."""
        return [lab for _, lab, _ in self._paths()]

    @property
    def donated(self) -> tuple[bool, ...]:
        if not self.sig.donate_argnums:
            return (False,) * len(self.leaves)
        return tuple(d for _, _, d in self._paths())

    def _paths(self) -> list[tuple[str, str, bool]]:
        if self._paths_cache is not None:
            return self._paths_cache
        tree = jax.tree_util.tree_unflatten(self.in_tree, [0] * len(self.leaves))
        pos_dyn = [i for i in range(self.n_args) if i not in self.static_pos]
        out = []
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if self.kw_form and path[0].idx == 1:
                nm = path[1].key + jax.tree_util.keystr(path[2:])
                out.append((nm, nm, False))
                continue
            path = path[1:] if self.kw_form else path
            i, rest = pos_dyn[path[0].idx], jax.tree_util.keystr(path[1:])
            said = self.sig.params[i] if i >= self.n_given else self.sig.name(i)
            donated = i in self.sig.donate_argnums or i - self.n_args in self.sig.donate_argnums  # -1: the last
            out.append((self.sig.name(i) + rest, said + rest, donated))
        self._paths_cache = out
        return out

    def check_live(self) -> None:
        """A DeletedArrayError naming the first leaf whose array is deleted: the leaf itself, or the
        primal / value behind a tracer of an eager transformation (jax.grad, jax.jvp, jax.vmap), which
        JAX would otherwise read (jax 0.10 could crash the process on such a buffer)."""
        for i, x in enumerate(self.leaves):
            dead = _deleted_array(x)
            if dead is not None:
                why = ("donate_argnums gave its buffers to an earlier call" if self.donated[i]
                       else "its buffers were donated to another function, or deleted")
                raise DeletedArrayError(
                    f"{self.sig.fn_name}: argument {self.labels[i]} {np.dtype(dead.dtype).name}{list(dead.shape)} has "
                    f"been deleted (as jax.jit says: Array has been deleted): {why}; pass a live array, e.g. that "
                    f"call's output")

    def rebuild(self, leaves: Sequence[Any]) -> tuple[tuple, dict]:
        """fn's (args, kwargs) from dynamic leaves, static values put back in place."""
        tree = jax.tree_util.tree_unflatten(self.in_tree, list(leaves))
        dyn_args, dyn_kwargs = tree if self.kw_form else (tree, {})
        if not self.statics:
            return tuple(dyn_args), dict(dyn_kwargs)
        static_args = {i: v for i, v in self.statics if isinstance(i, int)}
        it = iter(dyn_args)
        args = tuple(static_args[i] if i in static_args else next(it) for i in range(self.n_args))
        kwargs = dict(dyn_kwargs)
        kwargs.update((k, v) for k, v in self.statics if isinstance(k, str))
        return args, kwargs


def _aval(x, i: int, call: Call, plan_only: bool):
    if isinstance(x, np.ndarray):
        return jax.ShapeDtypeStruct(x.shape, _array_dtype(x, i, call))
    if isinstance(x, jax.Array):  # tracers too: keep weak types, as jax.jit does
        a = x.aval  # an array plan.place padded stands for its logical shape (runtime/placed.py)
        return jax.ShapeDtypeStruct(logical_shape(x) or a.shape, a.dtype, weak_type=a.weak_type)
    fn_name = call.sig.fn_name
    label = _Label(call, i)
    if isinstance(x, jax.ShapeDtypeStruct):
        if not plan_only:
            raise ArgumentError(
                f"{fn_name}: argument {label} is a jax.ShapeDtypeStruct: calling the function needs data; "
                f"use f.plan(...) to plan (and lower) from shapes alone")
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False))
    if isinstance(x, np.generic):
        return jax.ShapeDtypeStruct((), _array_dtype(x, i, call))
    if isinstance(x, _SCALARS):
        dtype = jax.dtypes.canonicalize_dtype(type(x) if not isinstance(x, bool) else np.bool_)
        if isinstance(x, int) and not isinstance(x, bool):
            info = np.iinfo(dtype)
            if not info.min <= x <= info.max:
                raise ArgumentError(
                    f"{fn_name}: argument {label} = {x} does not fit {np.dtype(dtype).name} "
                    f"(jax_enable_x64 is {'on' if dtype == np.int64 else 'off'}): pass an array of the dtype you "
                    f"want, or mark it static (static_argnums/static_argnames)")
        return jax.ShapeDtypeStruct((), dtype, weak_type=True)
    if hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "__array__") and not isinstance(x, type):
        return jax.ShapeDtypeStruct(tuple(x.shape), _array_dtype(x, i, call))
    hint = (" (a dtype? pass an array of it, e.g. np.zeros((), dtype), or mark it static)" if _is_dtype(x) else
            " (a function inside a model? split it off first, e.g. eqx.partition(model, eqx.is_array))"
            if callable(x) else "")
    raise ArgumentError(
        f"{fn_name}: argument {label} is {type(x).__name__} {short_repr(x, 40)}, not an array: mark it static "
        f"(static_argnums/static_argnames) or close over it{hint}")


def _deleted_array(x) -> Any:
    """The deleted jax.Array ``x`` is or carries (a JVP / linearize tracer's primal, a batch
    tracer's value, a partial-eval tracer's known value, nested), or None."""
    for _ in range(64):  # (a tracer of a tracer...: as deep as transformations nest)
        if not isinstance(x, jcore.Tracer):
            return x if isinstance(x, jax.Array) and x.is_deleted() else None
        pval = getattr(x, "pval", None)
        inner = next((getattr(x, a) for a in ("primal", "val") if hasattr(x, a)), None)
        if inner is None and pval is not None and pval.is_known():
            inner = pval.get_known()
        if inner is None:
            return None
        x = inner
    return None


def output_leaves(out, fn_name: str) -> tuple[list, Any]:
    """``fn``'s result flattened, each leaf a JAX array (Python scalars too, as under jax.jit); a
    leaf that cannot be one (a string, an object) is an ArgumentError naming the output, where
    jax.jit says "returned a value of type ..., which is not a valid JAX type"."""
    import jax.numpy as jnp

    with_paths, out_tree = jax.tree_util.tree_flatten_with_path(out)
    flat = []
    for i, (path, o) in enumerate(with_paths):
        try:
            flat.append(jnp.asarray(o))
        except TypeError:
            where = f"output{jax.tree_util.keystr(path)} (out{i})" if path else f"the output (out{i})"
            raise ArgumentError(
                f"{fn_name} returned {type(o).__name__} {short_repr(o, 40)} as {where}, which is not a valid JAX "
                f"type: a gp.spmd function (as a jax.jit one) returns arrays, Python scalars and pytrees of them") \
                from None
    return flat, out_tree


def _is_dtype(x) -> bool:
    """``np.float32`` / ``jnp.bfloat16`` / ``np.dtype('f4')``: a dtype where an array was meant."""
    try:
        return (isinstance(x, (np.dtype, type))) and np.dtype(x).kind in "biufcV"  # (bfloat16 is kind V)
    except TypeError:
        return False


def _array_dtype(x, i: int, call: Call):
    """A numpy leaf's dtype, when JAX can hold it: object, string, bytes and structured arrays are
    an ArgumentError naming the leaf (JAX's own error names neither it nor the function), one in a
    non-native byte order an ArgumentTypeError."""
    dt = np.dtype(x.dtype) if isinstance(x.dtype, np.dtype) else x.dtype
    if isinstance(dt, np.dtype) and (dt.kind in "OUS" or dt.names is not None):  # (bfloat16 is kind V too)
        raise ArgumentError(
            f"{call.sig.fn_name}: argument {_Label(call, i)} is a numpy array of dtype {dt} (shape "
            f"{tuple(np.shape(x))}), which JAX arrays cannot hold: convert it to a numeric dtype, or mark it "
            f"static (static_argnums/static_argnames) or close over it")
    if isinstance(dt, np.dtype) and not dt.isnative:  # as jax.jit (a TypeError), said with the leaf and the fix
        order = {">": "big", "<": "little"}.get(dt.byteorder, "non-native")
        raise ArgumentTypeError(
            f"{call.sig.fn_name}: argument {_Label(call, i)} is a numpy array of dtype {dt.str} ({order}-endian, not "
            f"this machine's byte order), which JAX arrays cannot hold (jax.jit refuses it too): convert it first, "
            f"e.g. x.astype(x.dtype.newbyteorder('='))")
    return x.dtype


class _Label:
    """A leaf's label, computed only when a message needs it."""

    def __init__(self, call: Call, i: int):
        self.call, self.i = call, i

    def __str__(self) -> str:
        return self.call.labels[self.i]


def _ints(v, what: str) -> frozenset[int]:
    v = (v,) if isinstance(v, (int, np.integer)) else tuple(v or ())
    for i in v:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise ArgumentError(f"{what} must be ints, got {i!r}")
    return frozenset(int(i) for i in v)


def _strs(v, what: str) -> frozenset[str]:
    v = (v,) if isinstance(v, str) else tuple(v or ())
    for s in v:
        if not isinstance(s, str):
            raise ArgumentError(f"{what} must be strings, got {s!r}")
    return frozenset(v)


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__
