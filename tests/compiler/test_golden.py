"""Golden text: the propagation result and the per-device program of a few reference
programs, as gspmd_py prints them (gspmd_py/views/pass_text.py), compared with the files in
tests/golden/ that a reviewer can diff, as Shardy's and XLA's partitioner tests read.

A change that moves a sharding or a collective shows as a diff of these files. To accept
one, regenerate them and review the diff::

    GSPMD_PY_GOLDEN=update python -m pytest -q tests/compiler/test_golden.py
    git diff tests/golden/

The text is gspmd_py's own (value ids, Shardy's notation, per-equation types and
collectives), not JAX's: it reads the same under every supported JAX version (pass_text's
PRIM_ALIASES evens out the primitive renames), and source lines are left out.
"""
from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.views import pass_text

P = gp.P
MESH = gp.Mesh.abstract((2, 4), ("x", "y"))  # planning needs no devices
S = jax.ShapeDtypeStruct
F32 = jnp.float32
GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def megatron_mlp(x, w1, w2):
    """Megatron's MLP: one all-reduce over y for the second matmul's partial sum; the roll
    folds into one rotate, one collective-permute over x."""
    x = gp.annotate(x, P("x", None))
    w1 = gp.annotate(w1, P(None, "y"))
    w2 = gp.annotate(w2, P("y", None))
    h = gp.tag(jax.nn.relu(x @ w1), "hidden")
    return jnp.roll(h @ w2, 1, axis=0)


def ffn_2d(x, w):
    """Both dims of the activation sharded, the contraction over y: a partial sum reduced at
    the output, which is laid out over x and y."""
    x = gp.annotate(x, P("x", "y"))
    w = gp.annotate(w, P("y", None))
    return gp.annotate(jnp.tanh(x @ w), P("x", "y"))


def scanned_layers(x, ws):
    """A scan over stacked weights: the loop keeps its carry's sharding, one all-reduce per
    iteration inside the loop body."""
    x = gp.annotate(x, P("x", None))
    ws = gp.annotate(ws, P(None, "y", None))

    def layer(h, w):
        return jnp.sin(h @ w), None

    h, _ = lax.scan(layer, x, ws)
    return h.sum(axis=1)


PROGRAMS = {
    "megatron_mlp": (megatron_mlp, (S((8, 16), F32), S((16, 32), F32), S((32, 16), F32))),
    "ffn_2d": (ffn_2d, (S((8, 16), F32), S((16, 8), F32))),
    "scanned_layers": (scanned_layers, (S((8, 16), F32), S((3, 16, 16), F32))),
}


def golden_texts(name: str) -> dict[str, str]:
    fn, args = PROGRAMS[name]
    plan = compiler.plan_jaxpr(jax.make_jaxpr(fn)(*args), MESH, name=name)
    return {
        "propagation": pass_text.propagation_text(plan.graph, MESH, plan.prop),
        "program": pass_text.program_text(plan.index, sources=False),
    }


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("kind", ["propagation", "program"])
def test_golden_text(name, kind):
    text = golden_texts(name)[kind] + "\n"
    path = GOLDEN / f"{name}.{kind}.txt"
    if os.environ.get("GSPMD_PY_GOLDEN") == "update":
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with GSPMD_PY_GOLDEN=update and review it"
    assert text == path.read_text(), (f"{name} {kind} differs from {path}; if the change is intended, "
                                      "regenerate with GSPMD_PY_GOLDEN=update and review the diff")
