"""Sharding rules, one module per op family, all in one registry (see rule.py for the notation)."""
from . import (callback, control, conv, dot, elementwise, gather, random, reduce, replicated, rotate, shape,  # noqa: F401
               split, stack)  # (registers the rules)
from .registry import has_rule, register, registered, rule_for
from .rule import (BROADCAST, DOT, ELEMENTWISE, HANDLER_NAMES, KINDS, NEED_REPLICATION, OTHER, PASS, PREFIX,
                   REDUCTION, SHARDABLE, WINDOW, Factor, OpRule, RuleBuilder)

__all__ = ["BROADCAST", "DOT", "ELEMENTWISE", "HANDLER_NAMES", "KINDS", "NEED_REPLICATION", "OTHER", "PASS", "PREFIX",
           "REDUCTION", "SHARDABLE", "WINDOW", "Factor", "OpRule", "RuleBuilder", "has_rule", "register", "registered",
           "rule_for"]
