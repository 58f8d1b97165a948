"""Random small programs (``gpt.programs()``: the generator lives in gspmd_py/testing/programs.py,
drawn over ``gpt.meshes()``, ``gpt.shardings()`` and ``gpt.fill()``'s values) (3-8 ops over random, often uneven, sometimes empty shapes) with
random input shardings and gp.annotate at random points (single, or chains of two
layouts, after a sum kept partial too), loops (lax.scan) with sharded carries and
constants, on meshes of up to 8 devices in any device order (the four 8-device meshes among them), in
every dtype users bring (float32, bfloat16, float16, int32, int8, bool) and with the
values that break partitioners (0, -0.0, +-inf, NaN, the smallest normal, values near the
dtype's max): the partitioned result equals the unpartitioned one.

Equality, per output, by what computed it (``gpt.programs``' ``analyze``):

* exact (integers, bools; floats moved, compared, negated, maxed, sorted, ...): the same
  bits as the unpartitioned program (NaN == NaN, signs of zeros and infinities), except
  that a max/min reduction may return either zero of -0.0 and +0.0 (IEEE 754 leaves the
  choice open; a reduction in another order picks the other one);
* float arithmetic (sums, dots, softmax, exp, ...; rounded in another order): NaN where
  NaN, the same infinities, finite values within ``TOL[dtype] * eps * (|want| + scale)``,
  ``scale`` the largest finite magnitude among the values the output was computed from.

The reference is the same function under jax.jit on one device (compiled, so XLA's fusion
rounds the same way; for exact outputs this is jax.jit's answer; XLA's own *partitioned*
answer is not used: it drops NaN in max/min all-reduces and overflows float16 partial sums).

Values near the dtype's max are drawn only where no accumulation of them happens: a sum,
dot or cumsum of such a value first clips it (``tame``), since overflow in a sum depends on
its order. Set GSPMD_PY_FUZZ=1 for thousands of programs; GSPMD_PY_FUZZ_REPORT=path writes
per-dtype counts (and, with GSPMD_PY_FUZZ_KEEP_GOING=1, every mismatch instead of stopping).
"""
from __future__ import annotations

import json
import os
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.testing.programs import Program, analyze, family, np_dtype
from partition_util import examples, fuzz_diff, report_problems

# tolerance of float arithmetic in epsilons of the dtype (see the module docstring)
TOL = {"float32": 8, "bfloat16": 8, "float16": 8}
MESH_8 = ((8,), ("x",), tuple(range(8)))
MESH_2x4 = ((2, 4), ("x", "y"), tuple(range(8)))
MESH_4x2 = ((4, 2), ("x", "y"), tuple(range(8)))
MESH_2x2x2 = ((2, 2, 2), ("x", "y", "z"), tuple(range(8)))


# -- running and comparing ----------------------------------------------------------------------------

STATS: Counter = Counter()
MISMATCHES: list = []


def check_program(prog: Program) -> list[str]:
    """Run ``prog`` partitioned and unpartitioned; the list of differences (empty: equal)."""
    mesh = prog.gp_mesh()
    args = prog.args()
    ref_all = jax.jit(prog.all_values)(*args)
    f = gp.spmd(prog, mesh, in_shardings=tuple(inp[1] for inp in prog.inputs), out_shardings=prog.out_specs)
    got = f(*args)
    plan = f.plan(*args)
    info = analyze(prog)
    dt = np_dtype(prog.dtype)
    tol = TOL.get(prog.dtype, 0) * float(jnp.finfo(dt).eps) if family(prog.dtype) == "float" else 0.0
    problems = []
    for i, (o, g) in enumerate(zip(prog.outputs, got)):
        exactness, _, deps = info[o]
        finite = [np.abs(np.asarray(ref_all[d], np.float64)) for d in sorted(deps) if not info[d][1]]
        finite = [a[np.isfinite(a)] for a in finite]
        scale = max([1.0] + [float(a.max()) for a in finite if a.size])
        diff, worst = fuzz_diff(g, ref_all[o], exactness, tol, scale)
        # the worst float error seen, in millionths of the tolerance
        STATS[(prog.dtype, "worst_err_ppm_of_tol")] = max(STATS[(prog.dtype, "worst_err_ppm_of_tol")], int(worst * 1e6))
        if diff:
            problems.append(f"output {i} ({['inexact', 'exact up to the sign of zero', 'exact'][exactness]}): {diff}")
        want_sharding = jax.sharding.NamedSharding(plan.jax_mesh, plan.out_specs[i])
        if not g.sharding.is_equivalent_to(want_sharding, g.ndim):
            problems.append(f"output {i}: laid out {g.sharding}, planned {want_sharding}")
    problems += report_problems(plan)
    return problems


def _run(prog: Program):
    STATS[(prog.dtype, "programs")] += 1
    STATS[(prog.dtype, "mismatches")] += 0
    modes = {inp[2] if len(inp) > 2 else "plain" for inp in prog.inputs}
    STATS[(prog.dtype, "special values")] += bool(modes - {"plain"})
    STATS[(prog.dtype, "empty values")] += any(0 in s for s in [inp[0] for inp in prog.inputs])
    STATS[(prog.dtype, "loops")] += any(op[0] == "scan" for op in prog.ops)
    STATS[(prog.dtype, "annotation chains")] += any(a[0] == b[0] == "annotate" and b[1] == len(prog.inputs) + i
                                                   for i, (a, b) in enumerate(zip(prog.ops, prog.ops[1:])))
    try:
        problems = check_program(prog)
    except Exception as e:  # noqa: BLE001 - a crash is a mismatch too
        if not os.environ.get("GSPMD_PY_FUZZ_KEEP_GOING"):
            raise
        problems = [f"raised {type(e).__name__}: {str(e)[:300]}"]
    if problems:
        STATS[(prog.dtype, "mismatches")] += 1
        MISMATCHES.append({"program": repr(prog), "problems": problems})
        if not os.environ.get("GSPMD_PY_FUZZ_KEEP_GOING"):
            raise AssertionError("; ".join(problems))


@pytest.fixture(scope="module", autouse=True)
def _fuzz_report():
    yield
    path = os.environ.get("GSPMD_PY_FUZZ_REPORT")
    if path:
        per = {}
        for (dt, what), n in sorted(STATS.items()):
            per.setdefault(dt, {})[what] = n
        with open(path, "w") as fh:
            json.dump({"per_dtype": per, "mismatches": MISMATCHES}, fh, indent=1)


@pytest.mark.slow
@examples(25)
@given(gpt.programs())
def test_random_programs(prog):
    _run(prog)


@pytest.mark.slow
def test_random_program_examples():
    """A few hand-picked programs of the kind the strategy draws (kept as regressions)."""
    progs = [
        Program(MESH_2x4, (((7, 13), gp.P("x", "y")), ((13,), None)),
                (("bcast_binary", "add", 0, 1, (0,)), ("reduce", "sum", 2, (0,), False), ("cumsum", 3, 0, True)),
                (4,), (None,)),
        Program(MESH_2x2x2, (((6, 5), gp.P(("x", "y"), "z")),),
                (("reshape", 0, (30,)), ("annotate", 1, gp.P("y")), ("unary", "tanh", 2), ("reshape", 3, (5, 6))),
                (4,), (gp.P(None, "x"),)),
        Program(MESH_4x2, (((12, 8), gp.P("y", "x")), ((8, 5), gp.P("x", None))),
                (("dot", 0, 1, 1, 0), ("softmax", 2, 1), ("transpose", 3, (1, 0))), (4,), (None,)),
        # a collective-permute over axes named out of mesh order (ppermute counts in mesh order)
        Program(MESH_8, (((1,), None),), (("concat", 0, 0, 0), ("unary", "abs", 1), ("unary", "abs", 2),
                                     ("annotate", 3, gp.P(("x:(2)4", "x:(1)2")))), (4,), (None,)),
        Program(MESH_2x4, (((1, 1), None),), (("unary", "abs", 0), ("concat", 1, 0, 1), ("unary", "abs", 2)),
                (3,), (gp.P(None, ("y", "x")),)),
    ]
    for p in progs:
        _run(p)
