"""The examples print what examples/README.md says they print: each ``python examples/<example>.py
ARGS`` shown there with its expected output is run (in this process, on the 8 CPU devices of
conftest.py) and its output compared line by line: the text, the collective counts by kind and
the shardings exactly; the losses to 1e-5 relative (their last digits differ between machines
and JAX versions, as the README says); "largest relative difference" below 1e-4."""
import collections
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
README = EXAMPLES / "README.md"
NEEDS = {"flax_gpt": ("flax", "optax"), "equinox_mlp": ("equinox", "optax"), "spatial_conv": ("flax", "optax"),
         "multihost_train": ()}
# "`python examples/<example>.py args`:" (a line of its own or the end of a paragraph), then a text block
SHOWN = re.compile(r"`python examples/(\w+)\.py([^`]*)`[^\n]*:\n\n```text\n(.*?)```", re.S)
LAUNCHED = re.compile(r"^`python -m gspmd_py\.launch ([^`]*)`.*?```text\n(.*?)```", re.S | re.M)
FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def load(name):
    spec = importlib.util.spec_from_file_location(f"gspmd_py_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # flax modules are dataclasses: they look their module up
    spec.loader.exec_module(mod)
    return mod


def shown() -> list[tuple[str, list[str], str]]:
    """(example, its arguments, the output the README shows), in README order."""
    return [(name, args.split(), text) for name, args, text in SHOWN.findall(README.read_text())]


def differences(expected: str, got: str) -> list[str]:
    """Where ``got`` does not print what ``expected`` shows (see the module docstring)."""
    want, have = expected.strip().splitlines(), got.strip().splitlines()
    if len(want) != len(have):
        return [f"{len(have)} lines printed, the README shows {len(want)}"]
    out = []
    for w, h in zip(want, have):
        wf, hf = [float(x) for x in FLOAT.findall(w)], [float(x) for x in FLOAT.findall(h)]
        if FLOAT.sub("#", w) != FLOAT.sub("#", h) or len(wf) != len(hf):
            out.append(f"printed {h!r}\n  README {w!r}")
        elif w.startswith("largest relative difference"):
            if not hf[0] < 1e-4:
                out.append(f"printed {h!r}: the losses differ")
        elif any(abs(a - b) > 1e-5 * max(1.0, abs(b)) for a, b in zip(hf, wf)):
            out.append(f"printed {h!r}\n  README {w!r} (numbers)")
    return out


def test_the_readme_shows_every_example_and_the_comparison_finds_a_difference():
    assert [name for name, _, _ in shown()] == ["flax_gpt", "equinox_mlp", "spatial_conv", "multihost_train"]
    text = "GPT on Mesh(x=2, y=4): 10 collectives per step {'all-reduce': 10}\n   0        4.544579\n"
    assert differences(text, text.replace("4.544579", "4.544580")) == []
    assert differences(text, text.replace("10 collectives", "18 collectives"))
    assert differences(text, text.replace("4.544579", "4.644579"))


@pytest.mark.slow
@pytest.mark.parametrize("name, args, expected", shown(), ids=[name for name, _, _ in shown()])
def test_the_example_prints_what_the_readme_shows(name, args, expected, capsys):
    for mod in NEEDS[name]:
        pytest.importorskip(mod)
    if name == "multihost_train":  # gp.distributed.initialize() first: a process of its own
        got = _run([sys.executable, str(EXAMPLES / f"{name}.py"), *args])
    else:
        load(name).main(args)
        got = capsys.readouterr().out
    assert not differences(expected, got), "\n".join(differences(expected, got)) + "\n\nprinted:\n" + got


def _run(cmd: list[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent))  # this checkout's gspmd_py
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=EXAMPLES.parent, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.slow
def test_the_launched_example_prints_what_the_readme_shows():
    """Two processes: the README's lines, in any order (the ranks interleave), and [Gloo] lines."""
    [(args, expected)] = LAUNCHED.findall(README.read_text())
    got = _run([sys.executable, "-m", "gspmd_py.launch", *args.split()])
    # Gloo's own lines (and their halves, when a rank's two writers interleave mid-line) are left out
    ours = lambda text: collections.Counter(l for l in text.strip().splitlines()
                                            if "[Gloo]" not in l and "peer ranks" not in l and l != "...")
    assert ours(got) == ours(expected), got
    assert all(re.match(r"\[rank [01]\] ", l) for l in got.strip().splitlines()), got
