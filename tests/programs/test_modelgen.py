"""Generated models (benchmarks/modelgen.py, issue 37 item 5) as correctness probes: at the tiny
size, gp.spmd under the hand plans of benchmarks/modelgen_plans.py computes what the
unpartitioned training step computes; the generator is deterministic (same seed, same model)."""
import jax
import numpy as np
import pytest

import gspmd_py as gp
from benchmarks import modelgen
from benchmarks import modelgen_plans
from partition_util import assert_same

TOL = dict(rtol=1e-3, atol=1e-4)  # float32 steps, reductions regrouped; Adam's m / sqrt(v) amplifies it for tiny grads
MESHES = (((2, 4), ("x", "y")), ((8,), ("x",)))
SEEDS = range(6)  # each a whole training step compiled 4 times: the slow tier


def test_same_seed_same_model():
    a, b = modelgen.generate(5, "tiny"), modelgen.generate(5, "tiny")
    assert a == b and a.roles == b.roles
    for u, v in zip(jax.tree.leaves(a.args), jax.tree.leaves(b.args)):
        np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    assert modelgen.generate(5, "bench").blocks == a.blocks  # one structure, two sizes
    assert len({modelgen.generate(s, "tiny").blocks for s in range(8)}) == 8


def test_the_draws_cover_the_block_kinds():
    words = " ".join(" ".join(modelgen.generate(s, "tiny").blocks) for s in range(24))
    for kind in ("attn(MHA", "GQA", "causal", "sliding", "SwiGLU", "GELU", "moe(top", "ragged", "conv1d",
                 "conv2d stem", "embedding", "input projection", "rnn", "segment", "FiLM", "scan x", "LM head"):
        assert kind in words, kind


def _plans(seed, mesh, model):
    """Two of the model's hand plans per mesh, rotating with the seed, Megatron always among them."""
    plans = modelgen_plans.hand_plans(model, mesh)
    names = sorted(plans)
    mega = next(k for k in names if k.startswith("Megatron"))
    other = [k for k in names if k != mega][seed % (len(names) - 1)]
    return {k: plans[k] for k in (mega, other)}


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_hand_plans_compute_the_model(seed):
    m = modelgen.generate(seed, "tiny")
    want = jax.jit(m.fn)(*m.args)
    for shape, axes in MESHES:
        mesh = gp.Mesh(shape, axes)
        for label, kw in _plans(seed, mesh, m).items():
            try:
                assert_same(gp.spmd(m.fn, mesh, **kw)(*m.args), want, **TOL)
            except AssertionError as e:
                raise AssertionError(f"{m.title} on {shape}, hand plan {label!r}: {e}") from None


def test_every_family_applies_where_it_should():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    for s in range(12):
        m = modelgen.generate(s, "tiny")
        plans = modelgen_plans.hand_plans(m, mesh)
        assert {"replicated", "data parallel (x,y)", "FSDP / ZeRO-3 (x,y)", "Megatron (x,y)",
                "data parallel (x) x Megatron (y)"} <= set(plans)
        assert any(k.startswith("expert") for k in plans) == m.has_experts
        assert any(k.startswith("sequence") for k in plans) == m.sequence_ok


def test_gqa_kv_heads_below_the_degree_stay_replicated():
    role = modelgen.Role("kv", 0, 2)
    assert modelgen_plans.megatron_spec(role, 2, "x", 8) is None
    assert modelgen_plans.megatron_spec(role, 2, "y", 2) == gp.P(None, "y")
    assert modelgen_plans.megatron_spec(modelgen.Role("row", 1), 3, "x", 8) == gp.P(None, "x", None)
