"""Sharding rules, one module per op family, all in one registry (see rule.py for the notation)."""
from . import conv, dot, elementwise, gather, reduce, replicated, shape, split  # noqa: F401  (registers the rules)
from .registry import has_rule, register, registered, rule_for
from .rule import (BROADCAST, DOT, ELEMENTWISE, KINDS, NEED_REPLICATION, OTHER, PASS, REDUCTION, WINDOW, Factor,
                   OpRule, RuleBuilder, einsum_rule)

__all__ = ["BROADCAST", "DOT", "ELEMENTWISE", "KINDS", "NEED_REPLICATION", "OTHER", "PASS", "REDUCTION", "WINDOW",
           "Factor", "OpRule", "RuleBuilder", "einsum_rule", "has_rule", "register", "registered", "rule_for"]
