"""Elementwise ops: every dim of every operand and the result is one pass factor.

    add  [m,n], [m,n] -> [m,n]      "i j, i j -> i j"
    add  [m,n], []    -> [m,n]      scalar operands carry no factor
    mul  [m,n], [1,n] -> [m,n]      "i j, 1 j -> i j" (lax broadcasts size-1 dims)
"""
from __future__ import annotations

import attrs

from . import facts as F
from .registry import declare, register
from .rule import ELEMENTWISE, OpRule, RuleBuilder

UNARY = (
    "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "lgamma", "digamma", "erf", "erfc", "erf_inv", "sqrt", "rsqrt", "cbrt", "abs", "not", "imag", "real",
    "conj", "integer_pow", "convert_element_type", "bitcast_convert_type", "population_count", "clz",
    "reduce_precision", "copy", "copy_p", "stop_gradient", "square", "optimization_barrier_elementwise",
    "bessel_i0e", "bessel_i1e",
    "log2", "one_minus_square",  # newer JAX (0.11: jnp.log2, tanh's derivative 1 - y^2)
)
NARY = (
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "and", "or",
    "xor", "eq", "ne", "lt", "le", "gt", "ge", "shift_left", "shift_right_logical", "shift_right_arithmetic",
    "complex", "igamma", "igammac", "random_gamma_grad", "polygamma", "zeta", "select_n", "clamp",
    "eq_to", "lt_to", "le_to",  # total-order comparisons (jnp.searchsorted, histogram, interp, sort keys)
    "igamma_grad_a", "regularized_incomplete_beta",
    "mulhi",  # newer JAX (0.11): the high half of an integer product
    "polynomial",  # newer JAX (0.12): Horner's rule, x and its coefficients broadcast (erf's gradient)
)
IDENTITY = ("gspmd_annotate", "gspmd_tag", "gspmd_pipeline", "stage")  # stage: lax.stage, lifts into the trace
# one transcendental per element (cost/counting.py)
TRANSCENDENTAL = (
    "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "cos", "cosh", "digamma", "erf", "erf_inv",
    "erfc", "exp", "exp2", "expm1", "igamma", "lgamma", "log", "log1p", "logistic", "pow", "rsqrt", "sin", "sinh",
    "sqrt", "tan", "tanh", "log2",
)
# elementwise, but costed as kernels of their own (the fusion model does not fuse them)
UNFUSED = ("bessel_i0e", "bessel_i1e", "eq_to", "lt_to", "le_to", "igamma_grad_a", "igammac", "polygamma",
           "random_gamma_grad", "regularized_incomplete_beta", "zeta", "optimization_barrier_elementwise")
# which partial values pass through (partitioner/partial.py's carry_modes)
LINEARITY = {"add": F.SUM, "sub": F.SUM, "add_any": F.JOIN, "neg": F.NEGATE, "real": F.NEGATE, "imag": F.NEGATE,
             "conj": F.NEGATE, "mul": F.SCALE, "div": F.DIVIDE, "select_n": F.SELECT, "copy": F.MOVE,
             "copy_p": F.MOVE, "convert_element_type": F.CONVERT, "optimization_barrier_elementwise": F.MOVE}


def _facts(prim: str) -> F.OpFacts:
    if prim == "stop_gradient":
        return F.OpFacts(F.ZERO, alias=F.ALWAYS)
    if prim in UNFUSED:
        return F.OpFacts(F.PER_OUTPUT, linearity=LINEARITY.get(prim, F.NONLINEAR))
    facts = F.OpFacts(F.ELEMENTWISE_FLOPS, transcendental=prim in TRANSCENDENTAL, fusion=F.FUSIBLE,
                      linearity=LINEARITY.get(prim, F.NONLINEAR))
    return attrs.evolve(facts, alias=F.SAME_DTYPE) if prim == "convert_element_type" else facts


for _p in UNARY + NARY:
    declare(_p, facts=_facts(_p))
declare(*IDENTITY, facts=F.OpFacts(F.ZERO, alias=F.ALWAYS, linearity=F.MOVE))

@register(*UNARY, *NARY, *IDENTITY, handler="elementwise")
def elementwise(op) -> OpRule:
    shape = op.outputs[0].shape
    b = RuleBuilder()
    fs = b.factors(shape)
    for v in op.inputs:
        if v.rank == len(shape):
            # lax broadcasts size-1 operand dims implicitly: such a dim carries no factor
            b.operand([f if n == m else None for f, n, m in zip(fs, v.shape, shape)])
        elif op.prim == "bitcast_convert_type":
            # to a narrower dtype the result gains a minor dim (f32[m,n] -> u8[m,n,4]), to a
            # wider one the operand loses it: the leading dims stay one factor each
            k = min(v.rank, len(shape))
            b.operand(list(fs[:k]) + [None] * (v.rank - k))
        else:
            b.operand([None] * v.rank)
    for _ in op.outputs:
        b.result(fs)
    return b.build(ELEMENTWISE)
