"""The examples run and match the unpartitioned run (a cheap smoke test: few steps, small models)."""
import importlib.util
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"gspmd_py_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # flax modules are dataclasses: they look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("name, needs, kwargs", [
    ("flax_gpt", ("flax", "optax"), dict(steps=2, layers=1)),
    ("equinox_mlp", ("equinox", "optax"), dict(steps=2)),
    ("spatial_conv", ("flax", "optax"), dict(steps=2)),
])
def test_example_runs_and_matches(name, needs, kwargs, capsys):
    for mod in needs:
        pytest.importorskip(mod)
    worst = load(name).main([], **kwargs)
    out = capsys.readouterr().out
    assert "loss (gp.spmd)" in out and "loss (unpartitioned)" in out and "0 replicated fallbacks" in out
    assert worst < 1e-4
