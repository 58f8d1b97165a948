"""Every piece of module-level state in gspmd_py is listed in docs/architecture.md's section
"Module-level state" with what it holds and what bounds it. The state is found by reading the
package's source: functions under a cache decorator (``functools.lru_cache`` / ``cache``),
module- or class-level containers that the module writes after import or that anything in
the package or the tests writes (``monkeypatch.setitem`` included), ``global`` statements,
context variables, and calls that switch the whole process (``gc.disable``,
``jax.config.update``, writes to ``os.environ``). Each is named ``<module file stem>.<name>``
(``sharding._OF_MEMO``, ``mesh.Mesh._interned``; a switch by the function that throws it), so
a module moving to another folder keeps its row."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
CACHE_DECORATORS = {"lru_cache", "cache"}
MUTATORS = {"append", "extend", "insert", "update", "setdefault", "clear", "pop", "popitem", "add", "discard",
            "remove", "move_to_end", "appendleft", "setitem"}
CONTAINERS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "WeakValueDictionary",
              "WeakKeyDictionary", "WeakSet"}
SWITCHES = {"gc.disable", "gc.freeze", "jax.config.update", "os.environ.setdefault", "os.environ.update",
            "sys.setrecursionlimit"}


def _name(node: ast.AST) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _is_container(value) -> bool:
    return isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) or (
        isinstance(value, ast.Call) and _name(value) in CONTAINERS)


def _holders(tree: ast.Module) -> dict[str, str]:
    """Module- and class-level names bound to a mutable container: name -> its listed name."""
    out = {}
    for node in tree.body:
        scope = [(node, "")] if isinstance(node, (ast.Assign, ast.AnnAssign)) else \
            [(b, node.name + ".") for b in node.body] if isinstance(node, ast.ClassDef) else []
        for stmt, prefix in scope:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None and _is_container(stmt.value):
                for t in stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]:
                    if isinstance(t, ast.Name):
                        out[t.id] = prefix + t.id
    return out


def _written(tree: ast.AST) -> set[str]:
    """Names whose items a module writes: ``x[k] = v``, ``del x[k]``, ``x.update(...)``,
    ``m.x.setdefault(...)``, ``monkeypatch.setitem(m.x, ...)``, or that it replaces by name
    (``monkeypatch.setattr(m, "x", ...)``)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            target = node.args[0] if node.func.attr == "setitem" and node.args else node.func.value
            out.add(_name(target))
        elif isinstance(node, ast.Call) and _name(node) == "setattr" and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant):  # monkeypatch.setattr(module, "SETTINGS", {...})
            out.add(str(node.args[1].value))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                if isinstance(t, ast.Subscript):
                    out.add(_name(t.value))
    return out


def module_state(package: Path, also_written_by=()) -> set[str]:
    """``<file stem>.<name>`` of every piece of module-level state under ``package``."""
    trees = {p: ast.parse(p.read_text(), str(p)) for p in sorted(package.rglob("*.py"))}
    written_elsewhere = set().union(*(_written(ast.parse(p.read_text())) for p in also_written_by),
                                    *(_written(t) for t in trees.values()))
    found = set()
    for path, tree in trees.items():
        stem = path.stem
        holders = _holders(tree)
        for name in holders.keys() & (_written(tree) | written_elsewhere):
            found.add(f"{stem}.{holders[name]}")
        for node in tree.body:  # context variables
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) \
                    and _name(node.value) == "ContextVar":
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    found.add(f"{stem}.{t.id}")
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if any(_name(d) in CACHE_DECORATORS for d in fn.decorator_list):
                found.add(f"{stem}.{fn.name}")
            for node in ast.walk(fn):
                if isinstance(node, ast.Global):
                    found.update(f"{stem}.{n}" for n in node.names)
                elif isinstance(node, ast.Call) and ast.unparse(node.func) in SWITCHES or (
                        isinstance(node, ast.Assign) and any(
                            isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"
                            for t in node.targets)):
                    found.add(f"{stem}.{fn.name}")
    return found


def listed(page: Path) -> set[str]:
    """The ``stem.name`` code spans of the page's "Module-level state" section (its table's first column)."""
    text = page.read_text()
    section = text.split("## Module-level state", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return {span for row in rows for span in re.findall(r"`([\w.]+)`", row)}


def test_every_module_level_cache_is_listed_on_the_architecture_page():
    tests = sorted((ROOT / "tests").rglob("*.py"))
    found = module_state(ROOT / "gspmd_py", tests)
    on_page = listed(PAGE)
    assert not found - on_page, (f"module-level state not listed in {PAGE.relative_to(ROOT)}'s 'Module-level state' "
                                 f"(say what it holds and what bounds it): {sorted(found - on_page)}")
    assert not on_page - found, f"rows naming state that is gone: {sorted(on_page - found)}"


def test_the_finder_sees_each_kind_of_state(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import contextvars, functools, gc, os\n"
        "MEMO = {}\nCONST = {'a': 1}\nSETTINGS = {'reps': 5}\n_LATE = None\n"
        "SCOPE = contextvars.ContextVar('s')\n\n"
        "class K:\n    table = {}\n    names = ('a',)\n\n"
        "@functools.lru_cache(maxsize=8)\ndef cached(x):\n    return x\n\n"
        "def get(k):\n    global _LATE\n    MEMO[k] = CONST['a']\n    K.table.setdefault(k, 1)\n    return MEMO\n\n"
        "def fast():\n    gc.disable()\n\n"
        "def env():\n    os.environ['X'] = '1'\n")
    test = tmp_path / "test_m.py"
    test.write_text("def test_it(monkeypatch):\n    monkeypatch.setitem(m.SETTINGS, 'reps', 1)\n"
                    "    monkeypatch.setattr(m, 'SIZES', [1])\n")
    (pkg / "n.py").write_text("SIZES = [1, 2]\nFIXED = [3]\n")
    assert module_state(pkg, [test]) == {"m.MEMO", "m.SETTINGS", "m.K.table", "m.SCOPE", "m.cached", "m._LATE",
                                         "m.fast", "m.env", "n.SIZES"}
