"""The command line and the package's face: ``python -m gspmd_py --help`` lists the commands
without importing JAX, ``demo --help`` helps instead of running, ``gspmd_py.__version__`` is
setup.cfg's version, and the demo compares gp.spmd with jax.jit given the same shardings."""
from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

import gspmd_py as gp

ROOT = Path(__file__).resolve().parents[2]

# run in a fresh interpreter: the command line's output, its exit status, and whether jax was imported
PROBE = """
import contextlib, io, sys
from gspmd_py.__main__ import _main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        rc = _main(sys.argv[1:])
    except SystemExit as e:
        rc = e.code
print(out.getvalue())
print("rc", rc, "jax imported", "jax" in sys.modules)
"""


def _probe(*argv: str) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_help_lists_the_commands_without_importing_jax():
    out = _probe("--help")
    assert "demo" in out and "python -m gspmd_py.launch" in out
    assert out.rstrip().endswith("rc 0 jax imported False")


def test_demo_help_helps_instead_of_running():
    out = _probe("demo", "--help")
    assert "usage: python -m gspmd_py demo" in out and "--runs" in out and "jax.jit" in out
    assert out.rstrip().endswith("rc 0 jax imported False")


def test_the_version_is_setup_cfgs():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert gp.__version__ == cfg["metadata"]["version"]
    assert _probe("--version").startswith(f"gspmd_py {gp.__version__}")


@pytest.mark.slow
def test_the_demo_compares_with_jax_jit_on_the_same_shardings(capsys):
    from gspmd_py.demo import main

    assert main(runs=1) == 0
    out = capsys.readouterr().out
    assert "max |gp.spmd - jax.jit| =" in out and "->  OK" in out
    assert "the same inputs, shardings and 8 CPU devices: gp.spmd" in out and "jax.jit (XLA's partitioner)" in out
