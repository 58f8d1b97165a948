"""User specs -> per-leaf shardings: in_shardings/out_shardings over argument pytrees, and
annotation specs inside the function.

``in_shardings`` / ``out_shardings`` are a spec (applies to every leaf below it) or a pytree
prefix of the arguments / outputs whose leaves are specs, as ``jax.jit`` takes them. Any JAX
pytree works (dicts, OrderedDicts, NamedTuples, registered dataclasses, ``eqx.Module``,
``nnx.State``, None leaves): spec leaves are matched to argument subtrees by KEY, never by
position in a sorted order, so an OrderedDict's specs land on the right keys::

    >>> leaf_specs((P("x", None), {"b": P("y"), "a": None}), (x, OrderedDict(b=w, a=v)), "in_shardings")
    [LeafSpec(path=[0], spec=P('x', None), ...), LeafSpec(path=[1]['b'], spec=P('y'), ...), ...]

Errors name the leaf by key path (``jax.tree_util.keystr``)::

    in_shardings[0]['params']['dense']['kernel'] (f32[4,8]): spec P('x', 'y', 'z') has 3 entries but the tensor has rank 2
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as JP

from .annotate import OPEN
from ..core.errors import AnnotationError, SpecError, short_repr
from ..core.mesh import AxisRef, Mesh
from .rules import Rules, is_spec, slash_path
from ..core.sharding import Sharding, named_spec

_tu = jax.tree_util


def type_text(x) -> str:
    """``f32[4,8]`` for an array-like, else the type's name."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        try:
            from ..core.ir import Value

            return Value(0, tuple(x.shape), x.dtype).type_str
        except Exception:  # pragma: no cover
            pass
    return type(x).__name__


@attrs.frozen
class LeafSpec:
    """The spec of one leaf: ``path`` (jax key path from the tree's root), ``spec`` (None: open)
    and ``where`` (the spec's place in in_shardings/out_shardings, for messages)."""

    path: tuple
    spec: Any
    where: str


# -- matching a spec tree to a pytree --------------------------------------------------------
def _children(node) -> list[tuple[Any, Any]]:
    """(key, child) pairs one level below ``node`` (None children included); [] for a leaf."""
    kids, _ = _tu.tree_flatten_with_path(node, is_leaf=lambda y: y is not node)
    return [(p[0], c) for p, c in kids if p]


def _is_leaf_node(node) -> bool:
    """A pytree leaf (an array, an object): not None, not a container (an empty one neither)."""
    t = _tu.tree_structure(node)
    return node is not None and t.num_leaves == 1 and t.num_nodes == 1


def _norm_key(k) -> tuple[str, Any]:
    if isinstance(k, _tu.DictKey):
        return ("key", k.key)
    if isinstance(k, _tu.GetAttrKey):
        return ("key", k.name)
    if isinstance(k, _tu.SequenceKey):
        return ("index", k.idx)
    if isinstance(k, _tu.FlattenedIndexKey):
        return ("index", k.key)
    return ("other", str(k))


def _keys_text(keys) -> str:
    return str(sorted(str(k[1]) for k in keys)) if all(k[0] == "key" for k in keys) else f"{len(keys)} entries"


def _pair_children(spec_node, tree_node, where: str, top: bool) -> list[tuple[Any, Any, Any]]:
    """(tree key, spec child, tree child) matched by key (dict keys, attribute names), or by
    position when the spec node is a sequence; a SpecError naming ``where`` otherwise."""
    skids, tkids = _children(spec_node), _children(tree_node)
    if tree_node is None or (not tkids and _is_leaf_node(tree_node)):
        raise SpecError(f"{where}: a {type(spec_node).__name__} of specs, but the "
                        f"{'arguments' if top else 'value'} there is {type_text(tree_node)}, not a pytree of that shape")
    skeys = [_norm_key(k) for k, _ in skids]
    tkeys = [_norm_key(k) for k, _ in tkids]
    if all(k[0] == "index" for k in skeys):  # a tuple/list of specs: by position (a NamedTuple's fields too)
        if len(skids) != len(tkids):
            what = "arguments" if top else f"elements of the {type(tree_node).__name__} there"
            raise SpecError(f"{where}: got {len(skids)} entries for {len(tkids)} {what}")
        return [(tk, sc, tc) for (_, sc), (tk, tc) in zip(skids, tkids)]
    by_key = {k: c for k, (_, c) in zip(skeys, skids)}
    if set(skeys) != set(tkeys) or len(by_key) != len(skeys):
        raise SpecError(f"{where}: keys {_keys_text(skeys)} do not match the "
                        f"{type(tree_node).__name__}'s keys {_keys_text(tkeys)}")
    return [(tk, by_key[nk], tc) for nk, (tk, tc) in zip(tkeys, tkids)]


def leaf_specs(specs, tree, what: str) -> list[LeafSpec]:
    """One LeafSpec per leaf of ``tree`` (jax flatten order): ``specs`` is a spec (for the whole
    tree) or a pytree prefix of ``tree`` whose leaves are specs or ``gp.rules``."""
    out: list[LeafSpec] = []
    uses: dict[int, tuple[Rules, set, list]] = {}

    def walk(spec_node, tree_node, path: tuple, where: str, top: bool) -> None:
        if is_spec(spec_node):
            for sub, _ in _tu.tree_flatten_with_path(tree_node)[0]:
                full = path + tuple(sub)
                if isinstance(spec_node, Rules):
                    rel = tuple(sub)
                    hits = spec_node.matches(rel)
                    i = hits[0] if hits else None
                    rec = uses.setdefault(id(spec_node), (spec_node, set(), [], []))
                    rec[1].update(hits)
                    rec[2].append(slash_path(rel))
                    if where not in rec[3]:
                        rec[3].append(where)
                    if i is None:
                        out.append(LeafSpec(full, None, f"{where} (no rule matched {slash_path(rel)!r})"))
                    else:
                        out.append(LeafSpec(full, spec_node.rules[i][1], f"{where} {spec_node.describe(i)}"))
                else:
                    out.append(LeafSpec(full, spec_node, where))
            return
        if top and not isinstance(spec_node, (tuple, list)):
            raise SpecError(f"{what}: {short_repr(spec_node)} is not a spec (gp.P / PartitionSpec / NamedSharding / "
                            f"gp.rules / None) nor a tuple with one entry per "
                            f"{'argument' if what.startswith('in') else 'output'}")
        if not _children(spec_node) and _is_leaf_node(spec_node):
            raise SpecError(f"{where}: {short_repr(spec_node)} ({type(spec_node).__name__}) is not a spec "
                            f"(gp.P / PartitionSpec / NamedSharding / gp.rules / None) nor a pytree prefix of the "
                            f"{'arguments' if what.startswith('in') else 'outputs'}")
        for key, sc, tc in _pair_children(spec_node, tree_node, where, top):
            walk(sc, tc, path + (key,), where + _tu.keystr((key,)), False)

    positional = what.startswith("in")
    if not positional and not is_spec(specs) and isinstance(specs, (tuple, list)) and len(specs) == 1 \
            and _is_leaf_node(tree):
        specs = specs[0]  # (spec,) for a function returning one array
    walk(specs, tree, (), what, positional)
    for rules, used, paths, wheres in uses.values():
        rules.check_unmatched(used, paths, ", ".join(wheres))
    return out


def leaf_name(prefix: str, path: Sequence) -> str:
    """``arg0``, ``arg1['params']['w']``, ``out0.kernel``: a leaf's name from its key path
    (positional index first)."""
    if not path:
        return f"{prefix}0"
    head, rest = path[0], tuple(path[1:])
    idx = head.idx if isinstance(head, _tu.SequenceKey) else None
    if idx is None:
        return prefix + _tu.keystr(tuple(path))
    return f"{prefix}{idx}{_tu.keystr(rest)}"


def leaf_names(tree, prefix: str = "arg") -> list[str]:
    """Names of the leaves of the positional arguments tuple (``arg0``, ``arg1['w']``)."""
    return [leaf_name(prefix, p) for p, _ in _tu.tree_flatten_with_path(tree)[0]]


def spec_dims(mesh: Mesh, specs, tree, ranks: Sequence[int], types: Sequence[str], what: str,
              names: Sequence[str] | None = None) -> list[Optional[tuple]]:
    """Per leaf of ``tree``: the canonical dims (tuple of AxisRef tuples) of its spec, or None
    when open. Errors name the leaf by key path and say which spec (or rule) gave it."""
    out: list[Optional[tuple]] = []
    leaves = leaf_specs(specs, tree, what)
    if len(leaves) != len(ranks):  # pragma: no cover - the same tree was flattened twice
        raise SpecError(f"{what}: {len(leaves)} spec leaves for {len(ranks)} values")
    for i, (ls, rank, ty) in enumerate(zip(leaves, ranks, types)):
        if ls.spec is None:
            out.append(None)
            continue
        leaf = _tu.keystr(ls.path)
        where = ls.where
        here = f"{what}{leaf}"
        name = names[i] if names else leaf
        label = f"{where} ({name} {ty})" if where == here else f"{where} for {name} {ty}"
        out.append(_dims_from_spec(mesh, ls.spec, rank, label))
    return out


def memory_kinds(specs, tree, what: str) -> list[Optional[str]]:
    """Per leaf of ``tree``: the memory kind its spec asks for (a jax NamedSharding's
    ``memory_kind``, e.g. "pinned_host"), or None for device memory and specs that say none."""
    if specs is None:
        return [None] * len(_tu.tree_leaves(tree))
    return [_memory_kind(ls.spec) for ls in leaf_specs(specs, tree, what)]


def _memory_kind(spec) -> Optional[str]:
    kind = getattr(spec, "memory_kind", None) if isinstance(spec, jax.sharding.Sharding) else None
    return None if kind in (None, "device") else kind


def _dims_from_spec(mesh: Mesh, spec, rank: int, what: str) -> tuple[Optional[tuple[AxisRef, ...]], ...]:
    if isinstance(spec, Sharding):
        if not spec.mesh.same_layout(mesh):
            raise SpecError(f"{what}: sharding is over {spec.mesh}, not the function's mesh {mesh}")
        s = spec
    else:
        if isinstance(spec, JP) and any(e is JP.UNCONSTRAINED for e in spec):
            raise SpecError(f"{what}: PartitionSpec.UNCONSTRAINED is for sharding constraints; use None "
                            f"for the whole value to be open")
        try:
            s = Sharding(mesh, spec, what=what)
        except SpecError as e:
            msg = str(e)
            raise SpecError(_hint(msg if msg.startswith(what) else f"{what}: {msg}")) from None
    s = s.with_rank(rank, what)
    return tuple(s.dims)


def _hint(msg: str) -> str:
    if "unknown mesh axis" in msg:
        return msg + (" (a logical axis name such as Flax's? map it to mesh axes first, e.g. "
                      "nn.logical_to_mesh(spec_tree, rules))")
    return msg


def annotation_dims(mesh: Mesh, op, rank: int) -> tuple[tuple, str]:
    """(dims, provenance) of an annotation op: gp.annotate / mesh_split, or a
    ``jax.lax.with_sharding_constraint`` converted by trace.py (its params carry ``jax_mesh``,
    the mesh its names refer to, and ``origin``)."""
    v = op.outputs[0]
    what = f"{op.params.get('origin', 'gp.annotate')} at {op.source or 'op %d' % op.id} on {v.type_str}"
    spec = op.params["spec"]
    if op.params.get("gp_mesh") is not None:
        _check_split_mesh(mesh, op.params["gp_mesh"], what)
    jm = op.params.get("jax_mesh")
    if jm is not None:
        spec = tuple(named_spec(mesh, jm, spec, what, open_entry=OPEN))
    return _annotation_dims(mesh, spec, rank, what), what


def _check_split_mesh(mesh: Mesh, given: Mesh, what: str) -> None:
    """gp.mesh_split's mesh is the function's own: its axis indices mean the function's axes, so
    other axis sizes or another device order would mean another tiling. (An abstract mesh stands for
    any device order.)"""
    if given.same_layout(mesh):
        return
    if (given.axis_names, given.shape) != (mesh.axis_names, mesh.shape):
        raise SpecError(f"{what}: its mesh has axes {dict(zip(given.axis_names, given.shape))} but the gp.spmd "
                        f"function's mesh has {dict(zip(mesh.axis_names, mesh.shape))}: pass the function's mesh")
    if not (given.is_abstract or mesh.is_abstract):
        raise SpecError(f"{what}: its mesh orders the devices {given.device_ids.reshape(-1).tolist()} but the gp.spmd "
                        f"function's mesh {mesh.device_ids.reshape(-1).tolist()}: pass the function's mesh")


def _annotation_dims(mesh: Mesh, spec: tuple, rank: int, what: str):
    if len(spec) > rank:
        raise SpecError(f"{what}: spec with {len(spec)} entries for a tensor of rank {rank}")
    out = []
    for d, e in enumerate(spec):
        if e == OPEN:
            out.append(None)
            continue
        try:
            entries = (e,) if isinstance(e, str) else tuple(e) if e is not None else ()
            out.append(tuple(mesh.ref(a) for a in entries))
        except SpecError as err:
            raise SpecError(_hint(f"{what}, dim {d}: {err}")) from None
    out += [()] * (rank - len(out))
    try:
        Sharding.of(mesh, [o or () for o in out])
    except SpecError as err:
        raise SpecError(f"{what}: {err}") from None
    return tuple(out)


# -- arguments -----------------------------------------------------------------------------
def leaf_aval(x, where):
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    if isinstance(x, (int, float, complex, bool, np.generic)):
        a = np.asarray(x)
        return jax.ShapeDtypeStruct(a.shape, jnp.asarray(x).dtype)
    name = f"argument leaf {where}" if isinstance(where, int) else f"argument {where}"
    hint = ""
    if callable(x):
        hint = " (a function inside a model? split it off first, e.g. eqx.partition(model, eqx.is_array))"
    raise AnnotationError(f"{name} is {type(x).__name__} {short_repr(x, 60)}, not an array or "
                          f"jax.ShapeDtypeStruct{hint}")
