"""What the package knows about an op lives with its rule in ops/ (OpFacts, ops/facts.py)."""
import pytest

from gspmd_py import ops
from gspmd_py.ops import facts as F


def test_every_registered_op_declares_its_facts():
    ops.check_facts()
    declared = set(ops.declared())
    missing = [p for p in ops.registered() if p not in declared]
    assert not missing
    for p in ops.registered():
        f = ops.facts_of(p)
        assert f.linearity in F.LINEARITIES and f.flops in F.FLOPS_KINDS, p


def test_an_undeclared_primitive_gets_the_unknown_facts():
    assert ops.facts_of("no_such_primitive") == F.UNKNOWN
    assert F.UNKNOWN.flops == F.PER_OUTPUT and F.UNKNOWN.linearity == F.NONLINEAR and not F.UNKNOWN.fusible


def test_facts_are_validated():
    with pytest.raises(ValueError):
        F.OpFacts("gigaflops")
    with pytest.raises(ValueError):
        F.OpFacts(F.ZERO, linearity="sometimes")


@pytest.mark.parametrize("prim, linearity", [
    ("add", F.SUM), ("sub", F.SUM), ("neg", F.NEGATE), ("add_any", F.JOIN), ("mul", F.SCALE), ("div", F.DIVIDE),
    ("select_n", F.SELECT), ("transpose", F.MOVE), ("slice", F.MOVE), ("reduce_sum", F.MOVE), ("pad", F.ZERO_PAD),
    ("convert_element_type", F.CONVERT), ("dot_general", F.NONLINEAR), ("exp", F.NONLINEAR), ("reduce_max", F.NONLINEAR),
])
def test_linearity(prim, linearity):
    assert ops.facts_of(prim).linearity == linearity


def test_flops_and_fusion():
    assert ops.facts_of("dot_general").flops == F.DOT_FLOPS
    assert ops.facts_of("conv_general_dilated").flops == F.CONV_FLOPS
    assert ops.facts_of("tanh").transcendental and ops.facts_of("tanh").fusible
    assert not ops.facts_of("add").transcendental
    assert ops.facts_of("reduce_sum").fused_consumer and not ops.facts_of("reduce_sum").fusible
    assert ops.facts_of("reshape").alias == F.ALWAYS
    assert ops.facts_of("convert_element_type").alias == F.SAME_DTYPE
    assert ops.facts_of("scatter-add").inplace and ops.facts_of("dynamic_update_slice").inplace
    assert ops.facts_of("gather").access == ops.facts_of("slice").access == F.WINDOW_READ
    assert ops.facts_of("dynamic_update_slice").access == F.UPDATE
    assert ops.facts_of("scatter-sub").access == F.SCATTER_UPDATE and ops.facts_of("add").access == F.WHOLE


def test_program_only_primitives():
    assert ops.facts_of("psum").collective == "all-reduce" and ops.facts_of("psum").collective_reduce == "sum"
    assert ops.facts_of("psum").combinable and not ops.facts_of("all_to_all").combinable
    assert ops.facts_of("ppermute").collective == "collective-permute"
    assert ops.facts_of("axis_index").flops == F.FREE
    assert ops.facts_of("scan").region == F.LOOP and ops.facts_of("pjit").region == F.CALL
    assert not ops.has_rule("psum")


def test_init_values_and_local_parameters():
    assert ops.facts_of("reduce_window_max").init == "max"
    slice_ = ops.facts_of("slice").localize
    params = {"start_indices": (0, 2), "limit_indices": (8, 6), "strides": None}
    # dim 0 taken whole (0..8) of a dim held as a block of 2 rows: the local slice ends at 2
    assert slice_(params, [(8, 8)], [(2, 8)], [(2, 4)])["limit_indices"] == (2, 6)
    assert ops.facts_of("broadcast_in_dim").localize({"shape": (8, 4)}, [(4,)], [(4,)], [(2, 4)])["shape"] == (2, 4)
    assert ops.facts_of("exp").localize is None
