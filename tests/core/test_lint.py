"""The repository stays clean: pyflakes' rules (ruff, in the test extra) find nothing in the
package, the tests, the benchmarks and the examples; and no function there is defined and never
used. The second check is a small AST pass: a function (or method) is used when its name is read
anywhere in those folders (a name, an attribute, an import, a string naming it such as
``getattr(x, "name")`` or a subprocess's script) or in a code span of README.md / docs/ (the
public API the pages document). Exempt: tests (``test_*``), pytest hooks (``pytest_*``),
dunders, functions a decorator registers (op rules, handlers, fixtures, the red-team table's
cases) and the overrides listed in ``OVERRIDES``."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("gspmd_py", "tests", "benchmarks", "examples")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CODE_SPAN = re.compile(r"```.*?```|`[^`\n]+`", re.S)
# decorators that register the function they decorate: it is called through a table
REGISTRARS = {"register", "handler", "case", "fixture"}
# methods a library calls by name (name -> where and why)
OVERRIDES = {
    "handle_starttag": "tests/views/test_pictures.py: html.parser.HTMLParser calls it",
    "handle_startendtag": "tests/views/test_pictures.py: html.parser.HTMLParser calls it",
    "handle_endtag": "tests/views/test_pictures.py: html.parser.HTMLParser calls it",
    "handle_data": "tests/views/test_pictures.py: html.parser.HTMLParser calls it",
}


def test_pyflakes_rules_find_nothing():
    """ruff's F rules: unused imports and names, redefinitions, undefined names (ruff is in setup.cfg's test extra)."""
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "F", "--no-cache", *FOLDERS],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def _read_names(tree: ast.AST, out: set[str]) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.fullmatch(r"[\w.]+", text):  # getattr(x, "name"), monkeypatch.setattr(mod, "name"), "a.b.name"
                out.update(text.split("."))
            elif "import" in text or "(" in text:  # a script run in a subprocess
                try:
                    with warnings.catch_warnings():  # a regex in the text: "invalid escape sequence"
                        warnings.simplefilter("ignore")
                        script = ast.parse(text)
                    _read_names(script, out)
                except SyntaxError:  # a piece of an f-string: "from m import f; f("
                    for m in re.finditer(r"import\s+([\w, ]+)", text):
                        out.update(IDENT.findall(m.group(1)))


def _decorator(d: ast.expr) -> str:
    d = d.func if isinstance(d, ast.Call) else d
    return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")


def unused_functions(root: Path, folders=FOLDERS, overrides=OVERRIDES) -> list[str]:
    """``path:line: name`` of every function under ``folders`` whose name nothing reads."""
    defs: list[tuple[str, str]] = []
    used: set[str] = set()
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            _read_names(tree, used)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not any(
                        _decorator(d) in REGISTRARS for d in node.decorator_list):
                    defs.append((node.name, f"{path.relative_to(root)}:{node.lineno}"))
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        if page.exists():
            for m in CODE_SPAN.finditer(page.read_text()):
                used.update(IDENT.findall(m.group(0)))
    return [f"{where}: {name}" for name, where in defs
            if name not in used and name not in overrides and not name.startswith(("test_", "pytest_"))
            and not (name.startswith("__") and name.endswith("__"))]


def test_no_function_is_defined_and_never_used():
    dead = unused_functions(ROOT)
    assert not dead, ("functions nothing calls (delete them, or list a library override in OVERRIDES):\n"
                      + "\n".join(dead))


def test_the_finder_sees_a_dead_function(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "import functools\n\n"
        "def used():\n    return 1\n\n"
        "def dead():\n    return used()\n\n"
        "@functools.lru_cache\ndef cached_dead():\n    return 2\n\n"
        "@register('x')\ndef registered():\n    return 3\n\n"
        "class C:\n    @property\n    def dead_property(self):\n        return 4\n\n"
        "    def by_name(self):\n        return 5\n\n"
        "getattr(C(), 'by_name')\n"
        "SCRIPT = 'from pkg.a import in_script; in_script()'\n\n"
        "def in_script():\n    return 6\n")
    dead = unused_functions(tmp_path, ("pkg",), {})
    assert [d.split(": ")[1] for d in dead] == ["dead", "cached_dead", "dead_property"]
