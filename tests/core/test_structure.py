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


def _components(edges: dict) -> list[list[str]]:
    """Strongly connected components of a graph (Tarjan), each sorted, nodes and edges in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (package __init__ re-exports aside)."""
    return [c for c in _components(EDGES) if len([m for m in c if m not in PACKAGES]) > 1]


def test_the_package_is_found():
    assert f"{PKG}.api.api" in MODULES and f"{PKG}.compiler" in MODULES and len(MODULES) > 50


def test_no_import_cycles():
    assert _cycles() == []


def test_the_cycle_finder_finds_a_cycle():
    saved = dict(EDGES)
    try:
        EDGES[f"{PKG}.core.mesh"] = EDGES[f"{PKG}.core.mesh"] + [f"{PKG}.core.sharding"]
        assert [f"{PKG}.core.mesh", f"{PKG}.core.sharding"] in _cycles()
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


def test_plans_stages_and_diagnostics_are_frozen_and_no_module_stores_on_them():
    """A Plan, its stages (runtime/stages.py: Lowered, Compiled: the one run-time object, each
    built once) and the partitioner's Diagnostics are frozen attrs values (a store raises:
    runtime/test_executable.py), and no module stores attributes on a stage or diagnostics."""
    import attrs

    from gspmd_py.partitioner.diagnostics import Diagnostics
    from gspmd_py.plan import Plan
    from gspmd_py.runtime.stages import Compiled, Lowered

    for cls in (Plan, Diagnostics, Lowered, Compiled):
        assert attrs.has(cls) and cls.__setattr__ is not object.__setattr__, cls
    assert _plan_uses(r"\b(?:lowered|compiled|diagnostics)\.\w+\s*=(?!=)") == []


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
    p.write_text(f"import {PKG}.partitioner.index_math as im\nfrom {PKG}.cost.calibrate import _fit\nim._jit('x')\n")
    assert len(_private_reaches(p)) == 2


#: test folders that are no room: whole programs crossing every layer; the golden texts
TEST_FOLDERS_BESIDE_LAYERS = ("programs", "golden")


def test_tests_live_in_folders_by_layer():
    """Test files sit in a folder per layer, named as the rooms of LAYERS (tests/README.md maps
    features to them)."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    readme = (TESTS / "README.md").read_text()
    missing = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                     if p.parent != TESTS and str(p.relative_to(TESTS)) not in readme)
    assert loose == [] and missing == []
    rooms = {r for rooms in LAYERS for r in rooms}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders - rooms - set(TEST_FOLDERS_BESIDE_LAYERS) == set(), "a test folder no room of LAYERS names"


# -- folders ------------------------------------------------------------------------------
# A room is a top-level module or a top-level sub-package of the package (as the structure
# tool, /work/shared/tools/structure.py, counts them); an import between two rooms is an edge.
# The package's own __init__ re-exports everything and is no room's dependency.
#: the rooms, bottom to top: a module imports only from its own room or one below it; every room
#: is listed (docs/architecture.md says what each holds; a test keeps its list equal to this one).
LAYERS = [
    ("core",),  # the values and seams every layer uses (CORE_ORDER inside)
    ("ops",),  # op rules and facts: data
    ("frontend",),  # the jaxpr importer: trace, annotations, specs, gp.rules, gp.pipeline
    ("propagation",),
    ("program",),  # the per-device program as data: Collective, the program index, the combiner
    ("cost",),
    ("partitioner",),
    ("runtime",),
    ("search",),  # the search engine and gp.tactics
    ("views",),
    ("plan",),
    ("compiler",),
    ("api",),  # gp.spmd, gp.auto_shard, gp.rank_meshes: what users call above the compiler
    ("demo", "__main__", "launch", "testing"),  # entry points; gspmd_py.testing (gp.testing) uses gp.spmd
]


#: gspmd_py/core/'s inner order, bottom to top: a core module imports only core modules of a lower
#: step (gspmd_py/core/__init__.py says what each holds).
CORE_ORDER = [
    ("errors", "dtypes", "jax_compat", "launch_env"),  # leaves: they import nothing of the package
    ("mesh", "ir"),  # the mesh (errors, the launcher's hint); the graph (dtypes)
    ("sharding", "fine_mesh"),  # over a mesh: shardings; the execution mesh and its device groups
]


def _core_climbs(edges: dict[str, list[str]]) -> list[str]:
    step = {f"{PKG}.core.{m}": i for i, mods in enumerate(CORE_ORDER) for m in mods}
    return [f"{a} imports {b}" for a, targets in sorted(edges.items()) if a in step for b in targets
            if b.startswith(f"{PKG}.core") and step.get(b, len(CORE_ORDER)) >= step[a]]


def test_the_core_keeps_its_inner_order():
    core = {m for m in MODULES if m.startswith(f"{PKG}.core.")}
    assert core == {f"{PKG}.core.{m}" for mods in CORE_ORDER for m in mods}, "a new core module: give it a step"
    assert _core_climbs(EDGES) == []


def test_the_core_climb_finder_finds_one():
    edges = {m: list(t) for m, t in EDGES.items()}
    edges[f"{PKG}.core.ir"] = edges[f"{PKG}.core.ir"] + [f"{PKG}.core.mesh"]
    assert _core_climbs(edges) == [f"{PKG}.core.ir imports {PKG}.core.mesh"]


def _room(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def _room_edges(edges: dict[str, list[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, targets in edges.items():
        if a == PKG:
            continue
        for b in targets:
            if b != PKG and _room(a) != _room(b):
                out.setdefault(_room(a), set()).add(_room(b))
    return out


def _folder_loops(redges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one room."""
    return [c for c in _components(redges) if len(c) > 1]


def test_folders_form_a_dag():
    assert _folder_loops(_room_edges(EDGES)) == []


def test_the_folder_loop_finder_finds_a_loop():
    """One climbing import (the core's mesh importing the user API) closes a loop through every
    room between them."""
    edges = {m: list(t) for m, t in EDGES.items()}
    edges[f"{PKG}.core.mesh"] = edges[f"{PKG}.core.mesh"] + [f"{PKG}.api.api"]
    loops = _folder_loops(_room_edges(edges))
    assert len(loops) == 1 and {f"{PKG}.core", f"{PKG}.api", f"{PKG}.compiler", f"{PKG}.plan"} <= set(loops[0])


def _climbs(edges: dict[str, list[str]]) -> list[str]:
    layer = {f"{PKG}.{r}": i for i, rooms in enumerate(LAYERS) for r in rooms}
    return [f"{a} imports {b}" for a, targets in sorted(edges.items()) if a != PKG for b in targets
            if _room(a) in layer and _room(b) in layer and layer[_room(a)] < layer[_room(b)]]


def test_imports_go_down_the_layers():
    assert _climbs(EDGES) == []
    assert {_room(m) for m in MODULES if m != PKG} <= {f"{PKG}.{r}" for rooms in LAYERS for r in rooms}, \
        "a new room: give it a layer in LAYERS and a bullet in docs/architecture.md's room list"


ARCHITECTURE = TESTS.parent / "docs" / "architecture.md"


def _documented_rooms(text: str) -> list[str]:
    """The rooms docs/architecture.md's "Rooms and their contracts" names, in order: per bullet
    the ``gspmd_py/<room>/`` or ``gspmd_py/<room>.py`` code spans before its first colon."""
    import re

    section = text.split("## Rooms and their contracts\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for bullet in re.findall(r"^- (.*)$", section, re.M):
        head = bullet.split(":", 1)[0]
        out += re.findall(rf"`{PKG}/(\w+)(?:/|\.py)`", head)
    return out


def test_the_architecture_page_lists_the_rooms_of_layers():
    assert _documented_rooms(ARCHITECTURE.read_text()) == [r for rooms in LAYERS for r in rooms]


def test_the_room_list_check_finds_a_difference():
    text = ARCHITECTURE.read_text().replace(f"- `{PKG}/views/`:", f"- `{PKG}/viewz/`:", 1)
    rooms = _documented_rooms(text)
    assert "viewz" in rooms and rooms != [r for rooms in LAYERS for r in rooms]


def test_no_file_over_600_lines():
    assert [m for m, p in MODULES.items() if len(p.read_text().splitlines()) > 600] == []


def test_the_climb_finder_finds_one():
    edges = {m: list(t) for m, t in EDGES.items()}
    edges[f"{PKG}.views.report"] = edges[f"{PKG}.views.report"] + [f"{PKG}.api.api"]
    assert _climbs(edges) == [f"{PKG}.views.report imports {PKG}.api.api"]


# -- attribute writes -----------------------------------------------------------------------
def _private_writes(source: str, name: str) -> list[str]:
    """``obj._x = ...`` (also augmented, annotated, in a tuple target, or by ``setattr`` /
    ``object.__setattr__`` with a literal name) where ``obj`` is not ``self``/``cls`` and no
    class of this module owns ``_x`` (assigns ``self._x`` or declares it in its body): a write
    to another object's private state."""
    tree = ast.parse(source)
    owned: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                owned.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                owned.add(n.id)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                owned.add(n.value)  # __slots__ entries, attrs field aliases
    private = lambda a: a.startswith("_") and not a.startswith("__") and a not in owned  # noqa: E731
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for a in ast.walk(t):
                if (isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store) and private(a.attr)
                        and not (isinstance(a.value, ast.Name) and a.value.id in ("self", "cls"))):
                    found.append((node.lineno, f"{name}:{node.lineno} writes {ast.unparse(a)}"))
        if (isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "object.__setattr__")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and private(node.args[1].value)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))):
            found.append((node.lineno, f"{name}:{node.lineno} writes {ast.unparse(node.args[0])}.{node.args[1].value}"))
    return [text for _, text in sorted(found)]


def test_no_module_writes_another_objects_private_attributes():
    assert [w for m, p in MODULES.items() for w in _private_writes(p.read_text(), m)] == []


def test_the_private_write_finder_finds_them():
    src = ("class Own:\n    def __init__(self):\n        self._mine = 1\n\n"
           "def f(spmd, other, own):\n    spmd._entries = other._entries\n    a, other._cache = 1, 2\n"
           "    own._mine = 3\n    setattr(spmd, '_fast', None)\n    spmd.public = 1\n    other._n += 1\n")
    assert _private_writes(src, "m") == ["m:6 writes spmd._entries", "m:7 writes other._cache",
                                         "m:9 writes spmd._fast", "m:11 writes other._n"]
