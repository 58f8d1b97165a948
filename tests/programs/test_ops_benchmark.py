"""``python -m benchmarks --only ops --quick`` runs and writes its table (no timing is asserted);
the table's deterministic part (collectives, XLA's cost analysis, HLO counts) on a few rows."""
from __future__ import annotations

from collections import Counter

from benchmarks import hlo, ops
from benchmarks.__main__ import main
from benchmarks.ops_cases import cases, missing_families


def test_every_rule_function_has_a_case_or_a_reason():
    from gspmd_py.ops.registry import rule_functions

    assert missing_families([fn.__name__ for fn in rule_functions()]) == []
    assert len({c.family for c in cases()}) >= 30


def test_quick_ops_benchmark_writes_its_table(tmp_path):
    assert main(["--only", "ops", "--quick", "--out", str(tmp_path), "--no-plots"]) == 0
    text = (tmp_path / "ops.md").read_text()
    assert "## Op by op" in text and "| 2x4 | gather | embedding take(table, ids) | batch |" in text
    rows = [line for line in text.splitlines() if line.startswith("| 2x4 |")]
    assert {r.split(" | ")[1] for r in rows} == {c.family for c in cases()}
    assert "Rule functions with no case" not in text
    flagged = [r for r in rows if r.rstrip(" |").endswith("**")]
    assert f"### Flagged rows ({len(flagged)})" in text


def test_hlo_counts_name_the_opcodes_that_differ():
    text = "\n".join(["%fused (p: f32[8]) -> f32[8] {", "  %p = f32[8]{0} parameter(0)",
                      "  ROOT %t = f32[8]{0} transpose(%p), dimensions={0}", "}",
                      "ENTRY %main (a: f32[8]) -> (f32[8], f32[8]) {", "  %a = f32[8]{0} parameter(0)",
                      "  %f = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused", "  %c = f32[8]{0} copy(%f)",
                      "  %s = f32[8]{0} all-reduce-start(%c), to_apply=%fused",
                      "  ROOT %r = (f32[8]{0}, f32[8]{0}) tuple(%c, %s)", "}"])
    got = hlo.op_counts(text)
    assert (got["fusion"], got["copy"], got["transpose"], got["all-reduce-start"]) == (1, 1, 0, 1)
    assert hlo.count_diff(got, Counter({"fusion": 1, "all-reduce": 1})) == "+1 copy"


def test_deterministic_rows_agree_with_xla_or_say_why():
    """Elementwise batch-sharded: both programs the same to XLA (no collective, same flops,
    fusions, copies), no flag. A row whose counts differ says its cause from the HLO diff
    (the collectives of both sides and the opcodes whose counts differ)."""
    by = {c.family: c for c in cases()}
    (same,) = ops.deterministic(by["elementwise"])
    assert same.ours == same.xla and same.ours.flops > 0 and same.ours.fusions >= 1 and same.flags == ""
    rows = ops.deterministic(by["dot_general"], layouts={"dim 1"})
    assert len(rows) == 1 and rows[0].ours.flops > 0 and rows[0].xla.flops > 0
    for r in rows:
        if r.ours.coll_bytes != r.xla.coll_bytes:
            assert r.flags.startswith("D") and r.ours.coll_kinds in r.cause() and r.xla.coll_kinds in r.cause()
        if r.diff:
            assert f"HLO diff: {r.diff}" in r.cause()
