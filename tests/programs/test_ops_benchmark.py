"""``python -m benchmarks --only ops --quick`` runs and writes its table (no timing is asserted)."""
from __future__ import annotations

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
