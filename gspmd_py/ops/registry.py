"""The op-rule registry: primitive name -> function(op) -> OpRule.

The only global mutable state in gspmd_py. Rules register next to their definition::

    @register("tanh", "exp", ...)
    def elementwise(op): ...
"""
from __future__ import annotations

from typing import Callable

from ..errors import UnsupportedOpError
from .rule import OpRule

RuleFn = Callable[..., OpRule]
_RULES: dict[str, RuleFn] = {}


def register(*names: str) -> Callable[[RuleFn], RuleFn]:
    def deco(fn: RuleFn) -> RuleFn:
        for n in names:
            if n in _RULES:
                raise ValueError(f"duplicate sharding rule for {n}")
            _RULES[n] = fn
        return fn

    return deco


def has_rule(prim: str) -> bool:
    return prim in _RULES


def registered() -> list[str]:
    return sorted(_RULES)


def rule_for(op) -> OpRule:
    fn = _RULES.get(op.prim)
    if fn is None:
        where = f" (at {op.source})" if getattr(op, "source", "") else ""
        raise UnsupportedOpError(
            f"primitive {op.prim!r}{where} has no sharding rule in gspmd_py; supported primitives: "
            f"{', '.join(registered()[:12])}, ... ({len(_RULES)} in all; see gspmd_py.ops.registered())"
        )
    return fn(op)
