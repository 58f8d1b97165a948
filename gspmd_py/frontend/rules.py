"""Sharding specs by name: ``gp.rules`` maps pytree key paths to specs.

A key path is written with ``/`` between its keys (dict keys, attribute names, sequence
indices), relative to where the rules sit in ``in_shardings`` / ``out_shardings``::

    >>> r = gp.rules([("*attn*/kernel", gp.P(None, "y")),   # glob: any key path prefix matches
    ...               (re.compile(r"mlp/.*/bias$"), None),    # regex: re.search on the whole path
    ...               ("*embed*", gp.P("y", None))])
    >>> f = gp.spmd(step, mesh, in_shardings=(r, gp.P("x")))   # arg 0 (a parameter tree) by name
    # arg 0 leaf ['params']['attn']['kernel'] has path "params/attn/kernel": P(None, "y")
    # arg 0 leaf ['params']['attn']['kernel'].value (a flax/nnx box) too: a glob matches any prefix

First match wins; a leaf no rule matches is left open (None: propagation decides). A
pattern that matches no leaf's path at all (a typo) is a SpecError (``unmatched="warn"`` warns instead,
``unmatched="ignore"`` says nothing), checked over every place the same rules object
is used in one ``in_shardings`` / ``out_shardings``.
"""
from __future__ import annotations

import fnmatch
import re
import warnings
from typing import Any, Iterable, Optional, Sequence

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

from ..core.errors import SpecError, short_repr
from ..core.sharding import P, Sharding

_UNMATCHED = ("error", "warn", "ignore")


def key_name(k) -> str:
    """One key of a jax key path as a path component: dict key, attribute name or index."""
    tu = jax.tree_util
    if isinstance(k, tu.DictKey):
        return str(k.key)
    if isinstance(k, tu.GetAttrKey):
        return k.name
    if isinstance(k, tu.SequenceKey):
        return str(k.idx)
    if isinstance(k, tu.FlattenedIndexKey):
        return str(k.key)
    return str(k)


def slash_path(path: Sequence) -> str:
    """``(DictKey('params'), GetAttrKey('kernel'))`` -> ``"params/kernel"``."""
    return "/".join(key_name(k) for k in path)


class Rules:
    """Specs by key path (see the module docstring); build with ``gp.rules``.

    ``rules`` is the tuple of (pattern, spec) pairs, first match wins; ``unmatched`` says what a
    rule that matches no leaf does ("error", "warn" or "ignore")."""

    __slots__ = ("rules", "unmatched", "_hash")

    def __init__(self, rules: Iterable, unmatched: str = "error"):
        if unmatched not in _UNMATCHED:
            raise SpecError(f"gp.rules: unmatched must be one of {_UNMATCHED}, got {short_repr(unmatched)}")
        if isinstance(rules, (str, bytes)) or not hasattr(rules, "__iter__"):
            raise SpecError(f"gp.rules expects a list of (pattern, spec) pairs, got {short_repr(rules)}")
        out = []
        for i, item in enumerate(rules):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise SpecError(f"gp.rules: rule {i} must be a (pattern, spec) pair, got {short_repr(item)}")
            pat, spec = item
            if not isinstance(pat, (str, re.Pattern)):
                raise SpecError(f"gp.rules: rule {i} pattern must be a glob string or a compiled regex, "
                                f"got {type(pat).__name__}")
            if isinstance(spec, Rules) or not is_spec(spec):
                raise SpecError(f"gp.rules: rule {i} ({_pat_text(pat)}) maps to {short_repr(spec)}, "
                                f"not a spec (gp.P / PartitionSpec / NamedSharding / None)")
            out.append((pat, spec))
        self.rules: tuple[tuple[Any, Any], ...] = tuple(out)
        self.unmatched = unmatched
        self._hash = hash((tuple((_pat_text(p), repr(s)) for p, s in self.rules), unmatched))

    def matches(self, path: Sequence) -> list[int]:
        """Indices of every rule matching the key path ``path`` (jax keys), in order; the first wins."""
        comps = [key_name(k) for k in path]
        prefixes = ["/".join(comps[:n]) for n in range(len(comps), 0, -1)] or [""]
        full = prefixes[0]
        out = []
        for i, (pat, _) in enumerate(self.rules):
            if isinstance(pat, re.Pattern):
                if pat.search(full):
                    out.append(i)
            elif any(fnmatch.fnmatchcase(p, pat) for p in prefixes):
                out.append(i)
        return out

    def match(self, path: Sequence) -> Optional[int]:
        """Index of the first rule matching the key path ``path`` (jax keys), or None."""
        m = self.matches(path)
        return m[0] if m else None

    def describe(self, i: int) -> str:
        """Rule ``i`` as error messages name it: ``rule 0 (*/kernel -> P(None, 'y'))``."""
        pat, spec = self.rules[i]
        return f"rule {i} ({_pat_text(pat)} -> {spec!r})"

    def check_unmatched(self, used: set[int], paths: list[str], what: str) -> None:
        """Report the rules whose pattern matches no leaf's path (per ``unmatched``); ``used``:
        the indices of the rules that matched some leaf (first or not)."""
        if self.unmatched == "ignore":
            return
        missing = [i for i in range(len(self.rules)) if i not in used]
        if not missing:
            return
        sample = ", ".join(repr(p) for p in paths[:6]) + (f", ... ({len(paths)} leaves)" if len(paths) > 6 else "")
        msg = (f"{what}: gp.rules {', '.join(self.describe(i) for i in missing)} matched no leaf; "
               f"the key paths there are {sample or 'none'}")
        if self.unmatched == "error":
            raise SpecError(msg + " (pass unmatched='warn' to allow it)")
        warnings.warn(msg, UserWarning, stacklevel=4)

    def __eq__(self, other) -> bool:
        return isinstance(other, Rules) and self._hash == other._hash and self.rules == other.rules \
            and self.unmatched == other.unmatched

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        """Rebuilt from its pairs (copy, deepcopy, pickle), so the hash is this process's."""
        return (Rules, (self.rules, self.unmatched))

    def __repr__(self) -> str:
        body = ", ".join(f"({_pat_text(p)}, {s!r})" for p, s in self.rules[:4])
        more = f", ... {len(self.rules)} rules" if len(self.rules) > 4 else ""
        return f"gp.rules([{body}{more}])"


def _pat_text(pat) -> str:
    return f"re {pat.pattern!r}" if isinstance(pat, re.Pattern) else repr(pat)


def rules(pairs: Iterable, *, unmatched: str = "error") -> Rules:
    """Specs by pytree key path: ``gp.rules([("*attn*/kernel", gp.P(None, "y")), ("*", None)])``.

    Usable wherever a spec is (``in_shardings``, ``out_shardings``, inside a tuple of
    per-argument specs). Patterns: a glob (``fnmatch``, ``*`` also crosses ``/``) that
    matches the leaf's key path or any prefix of it, or a compiled regex searched in the
    whole path. First match wins; unmatched leaves are open (None).
    """
    return Rules(pairs, unmatched=unmatched)


def is_spec(x) -> bool:
    """A spec leaf of an in_shardings/out_shardings tree: None, a spec, a sharding or gp.rules."""
    return x is None or isinstance(x, (P, JP, NamedSharding, Sharding, Rules))
