"""Sharding rules, one module per op family, all in one registry (see rule.py for the notation)."""
from . import (callback, control, conv, dot, elementwise, gather, keys, linalg, manual, program, ragged, random,  # noqa: F401
               reduce, replicated, rotate, shape, split, stack)  # (registers the rules and their facts)
from .facts import OpFacts
from .registry import check_facts, declare, declared, facts_of, has_rule, register, registered, rule_for
from .rule import (BROADCAST, DOT, ELEMENTWISE, HANDLER_NAMES, KINDS, NEED_REPLICATION, OTHER, PASS, PREFIX,
                   REDUCTION, SHARDABLE, WINDOW, Factor, OpRule, RuleBuilder)

__all__ = ["BROADCAST", "DOT", "ELEMENTWISE", "HANDLER_NAMES", "KINDS", "NEED_REPLICATION", "OTHER", "PASS", "PREFIX",
           "REDUCTION", "SHARDABLE", "WINDOW", "Factor", "OpFacts", "OpRule", "RuleBuilder", "declare", "declared",
           "facts_of", "has_rule", "register", "registered", "rule_for"]

check_facts()
