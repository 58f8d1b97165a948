"""The docs stay true: the Sphinx site builds with warnings as errors (when Sphinx is
installed: ``pip install -e ".[docs]"``), every page's python code blocks run (each page's
blocks in order, in one namespace, on the 8 CPU devices of conftest.py), and every
repository path that a doc, the README or a docstring names exists.

Every python block runs, as written (no placeholders); other fences (bash, text) never run.
A page whose blocks must start before JAX's backend does (``gp.distributed.initialize()``)
says so on a MyST comment line ``% fresh-process: why`` and runs in a new interpreter.
"""
from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line, code) of each python block of a page, in order."""
    return [(text[:m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == "python"]


def fresh_process(text: str) -> bool:
    return re.search(r"^% fresh-process", text, re.M) is not None


def run_page(page: str) -> None:
    """A page's python blocks, in order, in one namespace: a module of its own (dataclasses
    such as Flax modules look their module up in sys.modules)."""
    module = types.ModuleType("docs_" + page.replace("/", "_").replace(".", "_"))
    sys.modules[module.__name__] = module
    for line, code in python_blocks((ROOT / page).read_text()):
        try:
            exec(compile(code, f"{page}:{line}", "exec"), module.__dict__)
        except Exception as e:  # the page and line the block starts on, then the error
            raise AssertionError(f"{page}, the block at line {line}: {type(e).__name__}: {e}") from e


def test_the_pages_are_found_and_every_python_block_is_run():
    assert {"index.md", "getting-started.md", "concepts.md", "architecture.md", "performance.md", "api.md"} <= {
        p.name for p in PAGES}
    text = "```python\na = 1\n```\n\n% x\n```python\nb = 2\n```\n```bash\nexit 1\n```\n"
    assert python_blocks(text) == [(1, "a = 1\n"), (6, "b = 2\n")]
    assert not any("% norun" in p.read_text() for p in PAGES), "a placeholder block: write the program"
    assert fresh_process((DOCS / "guides" / "multihost.md").read_text()) and not fresh_process(text)


RUNNABLE = [p.relative_to(ROOT).as_posix() for p in [ROOT / "README.md", *PAGES] if python_blocks(p.read_text())]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE)
def test_the_code_blocks_of_a_page_run(page, capsys):
    """README.md's and each docs page's python blocks, in order, in one namespace (a new
    interpreter for a ``% fresh-process`` page, with this one's 8 CPU devices)."""
    if not fresh_process((ROOT / page).read_text()):
        run_page(page)
        return
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_docs; test_docs.run_page({page!r})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


# -- repository paths ---------------------------------------------------------------------
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|txt|png|cfg|toml|json|html))(?![\w/])")


def _tops() -> set[str]:
    """First components a repository path can start with: the repository's folders, the
    package's and the tests' (a docstring says ``partitioner/passes.py`` inside gspmd_py)."""
    return {p.name for base in (ROOT, ROOT / "gspmd_py", ROOT / "tests") for p in base.iterdir()
            if p.is_dir() and not p.name.startswith((".", "_"))}


def named_paths(path: Path, tops: set[str]) -> list[tuple[int, str]]:
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in PATH.finditer(text)
            if m.group(1).split("/")[0] in tops]


def _exists(name: str, where: Path) -> bool:
    return any((base / name).exists() for base in (ROOT, ROOT / "gspmd_py", ROOT / "tests", where.parent))


def test_every_repository_path_a_doc_or_docstring_names_exists():
    """A path with a folder in it (``gspmd_py/frontend/shifts.py``, ``partitioner/passes.py``,
    ``benchmarks/results/calls.md``) read from the root, the package, the tests or the file's
    own folder; bare file names and paths outside the repository (``jax/_src/...``) are not
    checked."""
    tops = _tops()
    files = [ROOT / "README.md", *PAGES, *ROOT.glob("examples/*.md"), *ROOT.glob("tests/README.md")]
    files += [p for d in ("gspmd_py", "tests", "benchmarks", "examples") for p in (ROOT / d).rglob("*.py")]
    stale = [f"{f.relative_to(ROOT)}:{line}: {name}" for f in files for line, name in named_paths(f, tops)
             if not _exists(name, f)]
    assert not stale, "paths that do not exist:\n" + "\n".join(stale)


def test_the_path_check_sees_a_stale_path(tmp_path):
    stale = "gspmd_py/" + "shifts.py"  # spelled in two parts, so this file names no stale path itself
    f = tmp_path / "x.md"
    f.write_text(f"see {stale} and gspmd_py/frontend/shifts.py, jax/_src/stages.py, plan.html")
    found = named_paths(f, _tops())
    assert [n for _, n in found] == [stale, "gspmd_py/frontend/shifts.py"]
    assert [n for _, n in found if not _exists(n, f)] == [stale]


# -- the Sphinx build ---------------------------------------------------------------------
@pytest.mark.slow
def test_the_docs_build_with_warnings_as_errors(tmp_path):
    """Sphinx + MyST are in the test extra (setup.cfg): the docs build is part of every run."""
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                        str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
