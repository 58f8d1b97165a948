"""The op registry: primitive name -> (rule function, handler name), and its ``OpFacts``.

The only global mutable state in gspmd_py. Rules register next to their definition and
name the partitioner handler that executes them; a name that is not one of
``rule.HANDLER_NAMES``, or a primitive registered twice, fails at import. Each module
declares the facts of the primitives it registers (facts.py); ``check_facts`` (run when
``gspmd_py.ops`` is imported) fails if a ruled primitive has none::

    @register("tanh", "exp", handler="elementwise")
    def elementwise(op) -> OpRule: ...

    declare("tanh", "exp", facts=OpFacts(ELEMENTWISE_FLOPS, transcendental=True, fusion=FUSIBLE))
"""
from __future__ import annotations

from typing import Callable, Hashable, Optional

import attrs

from ..core.errors import UnsupportedOpError
from . import collectives
from .facts import UNKNOWN, OpFacts
from .refused import reason
from .rule import HANDLER_NAMES, OpRule, whole

RuleFn = Callable[..., OpRule]
_RULES: dict[str, tuple[RuleFn, str]] = {}
_FACTS: dict[str, OpFacts] = {}


def register(*names: str, handler: str) -> Callable[[RuleFn], RuleFn]:
    if handler not in HANDLER_NAMES:
        raise ValueError(f"sharding rule for {names}: unknown handler {handler!r} (known: {sorted(HANDLER_NAMES)})")

    def deco(fn: RuleFn) -> RuleFn:
        for n in names:
            if n in _RULES:
                raise ValueError(f"duplicate sharding rule for primitive {n!r}")
            _RULES[n] = (fn, handler)
        return fn

    return deco


def has_rule(prim: str) -> bool:
    """Whether ``prim`` has a sharding rule of its own (one nobody ruled may still be computed
    whole, see ``_build_rule``)."""
    return prim in _RULES


def registered() -> list[str]:
    return sorted(_RULES)


def rule_functions() -> list[RuleFn]:
    """Every registered rule function, once each (one function serves several prims), by name."""
    return sorted({fn for fn, _ in _RULES.values()}, key=lambda fn: (fn.__module__, fn.__name__))


def handler_names_in_use() -> set[str]:
    return {h for _, h in _RULES.values()}


def rule_key(op) -> Optional[Hashable]:
    """What an op's rule depends on: its primitive, params and operand/result shapes and
    dtypes (a rule reads nothing else of an op without regions). None when the op has
    regions (their values enter the rule) or an unhashable param."""
    if op.regions:
        return None
    key = (op.prim, tuple((v.shape, v.dtype) for v in op.inputs), tuple((v.shape, v.dtype) for v in op.outputs),
           tuple(sorted(op.params.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def rule_for(op, memo: Optional[dict] = None) -> OpRule:
    """The op's rule. ``memo``: a dict shared over the ops of one graph, so that the ops of
    a repeated layer (96 transformer blocks: 6,721 ops, ~50 distinct rules) build each rule
    once; equal rules are then one object, which also makes comparing them an identity check."""
    key = rule_key(op) if memo is not None else None
    if key is not None:
        hit = memo.get(key)
        if hit is not None:
            return hit
    rule = _build_rule(op)
    if key is not None:
        memo[key] = rule
    return rule


def _build_rule(op) -> OpRule:
    entry = _RULES.get(op.prim)
    if entry is None:
        parts = [f"emitted by {op.scope.split('/')[0]!r}"] if getattr(op, "scope", "") else []
        parts += [f"at {op.source}"] if getattr(op, "source", "") else []
        where = f" ({', '.join(parts)})" if parts else ""
        if reason(op.prim):
            raise UnsupportedOpError(f"primitive {op.prim!r}{where} is not supported by gspmd_py: {reason(op.prim)}")
        if not getattr(op, "effects", False) and not op.regions:
            # a pure primitive nobody ruled (a library's own: equinox's unvmap_any): computed whole
            # on every device, a replicated fallback (warned and reported where it moves a sharded value)
            return attrs.evolve(whole(op), handler="replicated")
        raise UnsupportedOpError(
            f"primitive {op.prim!r}{where} has no sharding rule in gspmd_py; supported primitives: "
            f"{', '.join(registered()[:12])}, ... ({len(_RULES)} in all; see gspmd_py.ops.registered())"
        )
    fn, handler = entry
    return attrs.evolve(fn(op), handler=handler)


def declare(*names: str, facts: OpFacts) -> None:
    """Declare the facts of ``names`` (once per primitive)."""
    for n in names:
        if n in _FACTS:
            raise ValueError(f"facts of primitive {n!r} declared twice")
        _FACTS[n] = facts


def facts_of(prim: str) -> OpFacts:
    """The declared facts of ``prim`` (``facts.UNKNOWN`` for a primitive nobody declared)."""
    return _FACTS.get(prim, UNKNOWN)


def declared() -> list[str]:
    return sorted(_FACTS)


def check_facts() -> None:
    """Every primitive with a sharding rule has its facts declared, and the collective kinds'
    table (ops/collectives.py) agrees with the facts on which primitive is which kind."""
    missing = sorted(set(_RULES) - set(_FACTS))
    if missing:
        raise ValueError(f"primitives with a sharding rule but no declared OpFacts: {missing}")
    collectives.check({p: f.collective for p, f in _FACTS.items()})
