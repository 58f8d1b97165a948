"""gp.auto_shard and calibration report progress through the standard ``logging`` module
(loggers under "gspmd_py": INFO lines a notebook, a log file or a terminal shows alike), which
the logger's level silences; ``res.rules()`` prints the search's decisions by the names a user
knows (argument paths, tags) and replays them exactly."""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py.cost import calibrate

MESH = gp.Mesh((2, 4), ("x", "y"))
S = jax.ShapeDtypeStruct
ARGS = ({"w1": S((2048, 8192), jnp.float32), "w2": S((8192, 2048), jnp.float32)}, S((512, 2048), jnp.float32))


def mlp(params, x):
    h = gp.tag(jax.nn.relu(x @ params["w1"]), "hidden")
    return jnp.mean((h @ params["w2"]) ** 2)


def search():
    return gp.auto_shard(mlp, MESH, *ARGS, hardware=gp.Hardware.preset("h100-node"), max_evaluations=12)


def _ours(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("gspmd_py")]


def test_the_search_reports_progress_through_logging_and_the_level_silences_it(caplog):
    caplog.set_level(logging.INFO, logger="gspmd_py")
    res = search()
    said = _ours(caplog)
    assert any(m.startswith("auto_shard(mlp) on Mesh(x=2, y=4): searching, up to 12 candidates") for m in said), said
    assert any(f"auto_shard(mlp): {res.explored} candidates priced in" in m and "predicted step" in m for m in said)
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="gspmd_py")
    search()
    assert _ours(caplog) == []


def test_rules_print_by_name_and_replay_exactly():
    res = search()
    [rules] = res.rules()
    text = repr(res.rules())
    assert "arg0['w1']: P(" in text and "arg1: P(" in text and "value id" in text
    assert str(rules) == "auto()"  # how tactics lists and errors name it
    again = gp.spmd(mlp, MESH, tactics=res.rules()).plan(*ARGS)
    assert again.spmd_text() == res.plan.spmd_text()


@pytest.mark.slow
def test_calibration_reports_each_round(caplog):
    caplog.set_level(logging.INFO, logger="gspmd_py")
    calibrate.measure(gp.Mesh((2,), ("x",)), sizes=(2 ** 14,), reps=2)
    said = [m for m in _ours(caplog) if "calibrat" in m]
    assert said[0].startswith("calibrating Mesh(x=2): compiling the probes") and "round 2 of 2 measured" in said[-2]
    assert said[-1].startswith("calibrated Mesh(x=2) in")
