"""The one reshard planner (program/reshard_plan.py): its steps are values with a readable
text, the partitioner emits exactly their collectives (random source/target pairs on every
mesh, sub-axes and uneven dims included), and the search's cost tables price the same steps."""
from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gspmd_py as gp
from gspmd_py.core.ir import Graph
from gspmd_py.partitioner import reshard as reshard_mod
from gspmd_py.program.reshard_plan import Step, collective_steps, plan_reshard, steps_text
from gspmd_py.search.tables import CostTables
from partition_util import check, examples, meshes, rand, shapes, spec_for

AXES = (("x", 2), ("y", 4))


def test_steps_are_values_with_a_text_form():
    steps = plan_reshard((8, 16), (("x",), ("y",)), (("y",), ("x",)), AXES)
    assert steps_text(steps) == ("all-gather(x) dim 0 [4x4]\n"
                                 "all-to-all(y) dim 1 -> dim 0 [8x4]\n"
                                 "slice(x) dim 1 size 8 [2x16]")
    assert all(isinstance(s, Step) for s in steps) and steps[0].bytes(4) == 64 and steps[2].bytes(4) == 0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        steps[0].kind = "all-reduce"
    assert plan_reshard((8, 16), (("x",), ("y",)), (("y",), ("x",)), AXES) is steps  # planned once


def test_paths():
    ax3 = (("a", 2), ("b", 2), ("c", 2))
    swap = plan_reshard((8, 8), (("a",), ("b",)), (("b",), ("a",)), ax3)
    assert [(s.kind, s.axes) for s in swap] == [("collective-permute", ("a", "b"))] and len(swap[0].perm) == 4
    # a partial sum onto a dim that wants its axis: one reduce-scatter, no all-reduce
    (rs,) = plan_reshard((8, 8), ((), ()), (("a",), ()), ax3, ("a",))
    assert (rs.kind, rs.axes, rs.dim, rs.final) == ("reduce-scatter", ("a",), 0, True)
    # a partial sum kept where the target does not tile it
    assert plan_reshard((8, 8), ((), ()), ((), ("b",)), ax3, ("a",), keep_partial=True)[0].kind == "slice"
    # the whole value reduced first (one all-reduce for every consumer), then sliced
    first = plan_reshard((8, 8), ((), ()), ((), ("b",)), ax3, ("a",))[0]
    assert (first.kind, first.whole) == ("all-reduce", True)
    # uneven: [{x,y}] -> [{x}] on 5 rows (shards of 1) cannot concatenate to shards of 3: gathered
    # whole, re-sliced
    uneven = plan_reshard((5,), (("x", "y"),), (("x",),), AXES)
    assert [(s.kind, s.whole, s.trim, s.pad) for s in uneven] == [("all-gather", True, 5, -1), ("slice", False, -1, 6)]
    assert "regathered whole" in uneven[0].note


@examples(25)
@given(st.data(), meshes(), shapes(1, 3, dims=(1, 2, 3, 5, 7, 8, 12)))
def test_the_partitioner_emits_the_planned_collectives(data, mesh, shape):
    """Every collective of the program is a planned step, in order, at the planned bytes (the
    planner follows the local buffers through pads and trims)."""
    src = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    dst = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    planned: list = []

    def recording(*a, **k):
        steps = plan_reshard(*a, **k)
        planned.append(steps)
        return steps

    reshard_mod.plan_reshard = recording
    try:
        plan = check(lambda v: v * 2, mesh, (rand(shape, np.float32),), (src,), dst)
    finally:
        reshard_mod.plan_reshard = plan_reshard
    fine = plan.fine
    # the records name the user's mesh axes (fine sub-axes merged back): compare the group sizes
    emitted = [(c.kind, c.group_size, c.bytes_per_device) for c in plan.collectives]
    steps = [s for p in planned for s in collective_steps(p)]
    assert emitted == [(s.kind, int(np.prod([fine.size_of[a] for a in s.axes])), s.bytes(4)) for s in steps], \
        "\n\n".join(steps_text(p) for p in planned)
    if plan.in_dims[0] != plan.out_dims[0] and 0 not in shape:
        assert planned


def test_the_search_prices_the_planned_steps():
    """The cost tables price the planner's steps: [{a},{b}] -> [{b},{a}] is one collective-permute
    (the tables' own copy priced it as an all-to-all over both axes)."""
    mesh = gp.Mesh.abstract((2, 2, 2), ("a", "b", "c"))
    hw = gp.Hardware.preset("h100-node")
    tables = CostTables(Graph([], [], []), mesh, hw)
    a, b = mesh.ref("a"), mesh.ref("b")
    seconds, nbytes, _ = tables._reshard_cost((8, 8), 4, ((a,), (b,)), ((b,), (a,)), False)
    assert nbytes == 64 and seconds == pytest.approx(hw.collective_time("collective-permute", 64, mesh, ["a", "b"]))
