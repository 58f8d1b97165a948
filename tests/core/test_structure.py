"""The package's structure: no import cycles between its modules, no private name imported
from another module. Read from the source with ast (nothing is imported); every import of a
package module counts, at module level or inside a function (a deferred import is still a
dependency)."""
from __future__ import annotations

import ast
import pathlib

import gspmd_py

ROOT = pathlib.Path(gspmd_py.__file__).parent
PKG = ROOT.name


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()
PACKAGES = {m for m, p in MODULES.items() if p.name == "__init__.py"}


def _target(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if mod in PACKAGES else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str) -> list[tuple[str, str]]:
    """(imported package module, name imported from it or "") for every import in ``mod``."""
    out = []
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _target(mod, node)
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    out.append((sub, ""))
                elif base in MODULES:
                    out.append((base, a.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name in MODULES]
    return [(t, name) for t, name in out if t != mod]


EDGES = {m: sorted({t for t, _ in _imports(m)}) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (package __init__ re-exports aside)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan, iterative over each node's edges
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in EDGES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    for v in EDGES:
        if v not in index:
            visit(v)
    return [c for c in comps if len([m for m in c if m not in PACKAGES]) > 1]


def test_the_package_is_found():
    assert f"{PKG}.api.api" in MODULES and f"{PKG}.compiler" in MODULES and len(MODULES) > 50


def test_no_import_cycles():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle():
    saved = dict(EDGES)
    try:
        EDGES[f"{PKG}.mesh"] = EDGES[f"{PKG}.mesh"] + [f"{PKG}.sharding"]
        assert [f"{PKG}.mesh", f"{PKG}.sharding"] in _cycles()
    finally:
        EDGES.clear()
        EDGES.update(saved)


def test_no_private_name_imported_from_another_module():
    found = [f"{m} imports {name} from {t}" for m in MODULES for t, name in _imports(m)
             if name.startswith("_") and not name.startswith("__")]
    assert found == []


def _plan_uses(pattern: str) -> list[str]:
    import re

    rx = re.compile(pattern)
    out = []
    for mod, path in MODULES.items():
        if mod == f"{PKG}.plan":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            out += [f"{mod}:{i} {m.group(0)}" for m in rx.finditer(line)]
    return out


def test_no_module_reads_a_plans_private_fields():
    assert _plan_uses(r"\b(?:plan|p|self\.plan|self\._plan)\.(_[a-z]\w*)") == []


def test_no_module_stores_attributes_on_a_plan():
    assert _plan_uses(r"\b(?:plan|self\.plan|self\._plan)\.\w+\s*=(?!=)") == []


def test_plans_and_diagnostics_are_frozen_and_executables_change_only_in_their_module():
    """A Plan and the partitioner's Diagnostics are frozen attrs values (a store raises:
    runtime/test_executable.py); an Executable (runtime/executable.py) is the one object with
    run-time state, and no other module stores attributes on it."""
    import attrs

    from gspmd_py.partitioner.diagnostics import Diagnostics
    from gspmd_py.plan import Plan

    for cls in (Plan, Diagnostics):
        assert attrs.has(cls) and cls.__setattr__ is not object.__setattr__, cls
    stores = _plan_uses(r"\b(?:executable|exe|diagnostics)\.\w+\s*=(?!=)")
    assert [u for u in stores if not u.startswith(f"{PKG}.runtime.executable:")] == []


# -- the tests themselves -----------------------------------------------------------------
TESTS = pathlib.Path(__file__).resolve().parents[1]


def _private_reaches(path: pathlib.Path) -> list[str]:
    """Private names of the package a test file reaches: ``from gspmd_py.x import _y`` and
    ``m._y`` where ``m`` is bound to a package module (``import gspmd_py.x as m``,
    ``from gspmd_py.x import m``, ``import gspmd_py as gp``)."""
    tree = ast.parse(path.read_text())
    aliases: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == PKG}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == PKG and not node.level:
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {a.name} from {node.module}")
                if f"{node.module}.{a.name}" in MODULES:
                    aliases.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path.name}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


def test_tests_never_reach_private_names():
    found = [f for p in sorted(TESTS.rglob("*.py")) for f in _private_reaches(p)]
    assert found == []


def test_the_private_name_finder_finds_one(tmp_path):
    p = tmp_path / "t.py"
    p.write_text(f"import {PKG}.index_math as im\nfrom {PKG}.cost.calibrate import _fit\nim._jit('x')\n")
    assert len(_private_reaches(p)) == 2


def test_tests_live_in_folders_by_layer():
    """Test files sit in a folder per layer (tests/README.md maps features to them)."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    readme = (TESTS / "README.md").read_text()
    missing = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                     if p.parent != TESTS and str(p.relative_to(TESTS)) not in readme)
    assert loose == [] and missing == []
