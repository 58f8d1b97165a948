"""``python -m benchmarks.gpu_check --tiny`` (the GPU check, issue 38) runs here on CPU devices:
gp.spmd and jax.jit agree on its workloads and the report says where it ran."""
from __future__ import annotations

from benchmarks import gpu_check


def test_tiny_gpu_check_compares_and_reports(tmp_path):
    out = tmp_path / "gpu_check.md"
    assert gpu_check.main(["--tiny", "--only", "megatron_mlp", "--out", str(out)]) == 0
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| megatron_mlp |")]
    assert len(rows) == 1 and all("x** |" in r for r in rows)  # a per-call ratio on each
    assert "| megatron_mlp | 2x4 |" in text
    assert "has not been run on a GPU yet" in text  # the suite runs on CPU devices


def test_every_workload_has_a_mesh_on_one_device():
    names = [w.name for w in gpu_check.workloads(tiny=True)]
    assert {"demo", "demo_1dev", "megatron_mlp", "pipeline"} <= set(names) and any(n.startswith("gpt2:") for n in names)
    for w in gpu_check.workloads(tiny=True):
        assert gpu_check.mesh_shape_for(w, 1) == (1,) * len(w.axis_names)
