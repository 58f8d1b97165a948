"""gp.testing's metamorphic checks pass on sound programs and catch what they are for."""
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.partitioner import hierarchy

X = gpt.fill((6, 8), np.float32, 1)
W = gpt.fill((8, 5), np.float32, 2)


def mlp(x, w):
    h = jnp.tanh(x @ w)
    return jnp.sum(h * h, axis=1), jnp.max(h, axis=0)


def test_annotating_an_intermediate_never_changes_values():
    gpt.assert_annotation_invariant(mlp, X, W, mesh=gp.Mesh((2, 4), ("x", "y")), max_examples=5)


def test_annotation_invariance_catches_a_dropped_all_reduce(monkeypatch):
    monkeypatch.setattr(hierarchy, "all_reduce_sum", lambda ctx, x, axes: x)
    with pytest.raises(AssertionError, match="changed the result"):
        gpt.assert_annotation_invariant(mlp, X, W, mesh=gp.Mesh((2, 4), ("x", "y")), max_examples=20)


def test_permuted_device_order_gives_the_same_bits():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    gpt.assert_device_order_invariant(mlp, X, W, mesh=mesh, in_shardings=(gp.P("x", "y"), gp.P("y", None)),
                                      max_examples=3)


def test_same_program_text_across_runs_and_processes():
    gpt.assert_deterministic(mlp, X, W, mesh=gp.Mesh((2, 4), ("x", "y")),
                             in_shardings=(gp.P("x", "y"), gp.P("y", None)), processes=1)
    with pytest.raises(TypeError, match="module-level function"):
        gpt.assert_deterministic(lambda x: x, X, mesh=gp.Mesh((2,), ("x",)), processes=1)
