"""The API reference is complete: every public name of ``gspmd_py``, ``gspmd_py.tactics``,
``gspmd_py.testing`` and ``gspmd_py.distributed``, and every public method and property of
the classes they hold or return (Plan, Spmd, Lowered, Compiled, AutoResult, Cost, ...), has
a docstring and an entry in docs/api.md (an autodoc directive naming it, or its class's
``:members:``); every public field of those classes is named in its class's docstring.

docs/api.md is read, not built (tests/core/test_docs.py builds the site).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path

import attrs

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.api.auto import SearchedRules
from gspmd_py.cost.model import CollectiveCost, OpCost
from gspmd_py.runtime.stages import Compiled, Lowered

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODULES = {"gspmd_py": gp, "gspmd_py.tactics": gp.tactics, "gspmd_py.testing": gpt,
           "gspmd_py.distributed": gp.distributed}
RETURNED = (gp.Plan, gp.Spmd, Lowered, Compiled, gp.AutoResult, gp.Cost, CollectiveCost, OpCost, gp.Collective,
            gp.Schedule, gp.Hardware, SearchedRules)
DIRECTIVE = re.compile(r"^\.\. auto(module|class|function|exception):: (\S+)\n((?:   +\S.*\n)*)", re.M)


def resolve(dotted: str):
    """The object a directive names: the longest importable module prefix, then attributes
    (``gspmd_py.tactics.batch`` is gp.tactics, an attribute of gspmd_py, then batch)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return functools.reduce(getattr, parts[i:], obj)
    raise ImportError(dotted)


def entries(text: str) -> dict[int, object]:
    """id(object) -> the members its entry documents: a set of names, or None for all (a
    class's bare ``:members:``)."""
    out: dict[int, object] = {}
    for m in DIRECTIVE.finditer(text):
        kind, target, opts = m.groups()
        members = re.search(r":members:(.*(?:\n   +[^:\s].*)*)", opts)
        names = None if members is None else {n.strip() for n in members.group(1).replace("\n", " ").split(",")
                                              if n.strip()}
        obj = resolve(target)
        if kind == "module":
            for n in names or ():
                out[id(getattr(obj, n))] = set()
        else:
            out[id(obj)] = set() if members is None else (names or None)
    return out


def public_names(modname: str, module) -> list[tuple[str, object]]:
    """(name, object) per public name: ``__all__``, or the functions, classes and UPPER
    constants a module defines (not what it imports for its own use)."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return [(n, getattr(module, n)) for n in names]
    out = []
    for n, obj in vars(module).items():
        if n.startswith("_") or inspect.ismodule(obj):
            continue
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__:
            out.append((n, obj))
        elif n.isupper() and not callable(obj):
            out.append((n, obj))
    return out


def members(cls) -> dict[str, object]:
    """The public methods and properties of ``cls``, its own and its bases' (not builtins')."""
    out: dict[str, object] = {}
    for k in reversed(inspect.getmro(cls)):
        if k.__module__ == "builtins":
            continue
        for n, v in vars(k).items():
            if not n.startswith("_") and isinstance(v, (property, functools.cached_property, classmethod,
                                                        staticmethod, type(lambda: 0))):
                out[n] = v
    return out


def fields(cls) -> list[str]:
    """The public data fields of ``cls``: attrs fields, or ``__slots__``."""
    names = [f.name for f in attrs.fields(cls)] if attrs.has(cls) else list(getattr(cls, "__slots__", ()))
    return [n for n in names if not n.startswith("_")]


def class_gaps(cls, covered) -> list[str]:
    """What a class's entry lacks: a method or property without a docstring, or outside the
    entry's ``:members:`` list; a field its docstring does not name."""
    doc = inspect.getdoc(cls) or ""
    gaps = []
    for n, v in members(cls).items():
        f = v.__func__ if isinstance(v, (classmethod, staticmethod)) else v
        if not (getattr(f, "__doc__", None) or "").strip():
            gaps.append(f"{cls.__name__}.{n}: no docstring")
        elif covered is not None and n not in covered:
            gaps.append(f"{cls.__name__}.{n}: not in the entry's :members:")
    gaps += [f"{cls.__name__}.{n}: a field the class docstring does not name" for n in fields(cls)
             if not re.search(rf"\b{n}\b", doc)]
    return gaps


def gaps(text: str) -> list[str]:
    found = entries(text)
    out = []
    classes = list(RETURNED)
    for modname, module in MODULES.items():
        for n, obj in public_names(modname, module):
            if inspect.ismodule(obj):
                continue
            if not (callable(obj)):
                if not re.search(rf"\b{n}\b", text):
                    out.append(f"{modname}.{n}: not named in docs/api.md")
                continue
            if not (inspect.getdoc(obj) or "").strip():
                out.append(f"{modname}.{n}: no docstring")
            if id(obj) not in found:
                out.append(f"{modname}.{n}: no entry in docs/api.md")
            if inspect.isclass(obj) and obj not in classes:
                classes.append(obj)
    for cls in classes:
        if id(cls) not in found:
            out.append(f"{cls.__name__}: no entry in docs/api.md")
            continue
        if not issubclass(cls, BaseException):
            out += class_gaps(cls, found[id(cls)])
    return sorted(set(out))


def test_every_public_name_has_a_docstring_and_an_entry():
    assert gaps(API.read_text()) == []


def test_a_missing_entry_or_docstring_is_found():
    text = API.read_text()
    plan_entry = ".. autoclass:: gspmd_py.Plan\n   :members:\n"
    assert plan_entry in text
    assert "gspmd_py.Plan: no entry in docs/api.md" in gaps(text.replace(plan_entry, ""))
    assert "gspmd_py.tactics.zero: no entry in docs/api.md" in gaps(text.replace(".. autofunction:: gspmd_py.tactics.zero\n", ""))

    @attrs.frozen
    class Thing:
        """A thing with ``size``."""

        size: int
        color: str

        def shown(self) -> str:
            return "no docstring"

        @property
        def area(self) -> int:
            """Documented."""
            return self.size

    assert Thing(2, "red").area == 2
    assert class_gaps(Thing, None) == ["Thing.shown: no docstring", "Thing.color: a field the class docstring "
                                       "does not name"]
    assert class_gaps(Thing, {"shown"}) == ["Thing.shown: no docstring", "Thing.area: not in the entry's :members:",
                                            "Thing.color: a field the class docstring does not name"]
