"""A failing example as a standalone Python script (gp.testing's failure messages end with one).

The script sets up 8 CPU devices, defines the function (its source, when Python can find it;
the traced program is in a comment either way), builds the mesh with the same device order,
the arguments bit for bit (base64 of their bytes: NaN payloads and -0.0 survive), runs
gp.spmd and the reference, prints the plan's report and asserts what the check asserted.
"""
from __future__ import annotations

import ast
import base64
import inspect
import textwrap
from typing import Any, Callable, Optional

import jax
import numpy as np

from ..core.mesh import Mesh


def function_source(fn: Callable) -> tuple[str, str]:
    """(Python source defining the function, the name it is bound to); ('', '') when unknown."""
    own = getattr(fn, "gpt_source", None)
    if callable(own):
        return own(), "fn"
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return "", ""
    src = textwrap.dedent("".join(lines))
    name = getattr(fn, "__name__", "")
    if name != "<lambda>":
        if src.lstrip().startswith(("def ", "@")) and name.isidentifier():
            return src.rstrip() + "\n", name
        return "", ""
    try:  # a lambda: its own expression out of the line(s) that hold it
        tree = ast.parse(src)
    except SyntaxError:
        try:
            tree = ast.parse("(" + src.strip().rstrip(",") + ")")
            src = "(" + src.strip().rstrip(",") + ")"
        except SyntaxError:
            return "", ""
    want = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Lambda) and [a.arg for a in node.args.args] == want:
            seg = ast.get_source_segment(src, node)
            if seg:
                found.append(seg)
    for seg in found:  # the lambda that compiles to fn's own code (several may share a line)
        try:
            code = next(c for c in compile(seg, "<lambda>", "eval").co_consts if hasattr(c, "co_code"))
        except (SyntaxError, StopIteration):
            continue
        if code.co_code == fn.__code__.co_code and code.co_names == fn.__code__.co_names:
            return f"fn = {seg}\n", "fn"
    return (f"fn = {found[0]}\n", "fn") if len(found) == 1 else ("", "")


def _array_src(a) -> str:
    a = np.asarray(a)
    b64 = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()
    return f"_a({b64!r}, {a.dtype.name!r}, {tuple(a.shape)!r})"


def _tree_src(tree) -> str:
    if isinstance(tree, (tuple, list)):
        inner = ", ".join(_tree_src(t) for t in tree)
        return f"({inner}{',' if len(tree) == 1 else ''})" if isinstance(tree, tuple) else f"[{inner}]"
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k!r}: {_tree_src(v)}" for k, v in tree.items()) + "}"
    if hasattr(tree, "shape") and hasattr(tree, "dtype"):
        return _array_src(tree)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if len(leaves) == 1 and leaves[0] is tree:
        return repr(tree)
    return f"jax.tree_util.tree_unflatten({treedef!r}, [{', '.join(_array_src(x) for x in leaves)}])"


def _spec_src(spec) -> str:
    if spec is None:
        return "None"
    if isinstance(spec, (tuple, list)) and not type(spec).__name__ in ("P", "PartitionSpec"):
        inner = ", ".join(_spec_src(s) for s in spec)
        return f"({inner}{',' if len(spec) == 1 else ''})"
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {_spec_src(v)}" for k, v in spec.items()) + "}"
    return "gp.P(" + ", ".join(repr(e) for e in spec) + ")"


def mesh_src(mesh: Mesh) -> str:
    ids = mesh.device_ids.reshape(-1).tolist()
    default = ids == list(range(len(ids)))
    return (f"gp.Mesh({mesh.shape!r}, {mesh.axis_names!r}" + ("" if default else f", devices={ids!r}") + ")")


HEADER = '''\
import os
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
import base64
import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.testing.equivalence import apply_mode, compare_trees


def _a(b64, dtype, shape):
    return np.frombuffer(base64.b64decode(b64), jnp.dtype(dtype)).reshape(shape).copy()

'''


def script(fn: Callable, mesh: Mesh, args, in_shardings, *, mode: str = "value", reference: Any = None,
           tol: Any = "auto", jaxpr: Optional[str] = None, summary: str = "") -> str:
    """The standalone script of one example (see the module doc)."""
    src, name = function_source(fn)
    out = [f"# gp.testing reproducer: {summary}".rstrip(), HEADER]
    if jaxpr:
        out.append("# the function's program (jax.make_jaxpr):\n" + textwrap.indent(jaxpr.rstrip(), "#   ") + "\n")
    if src:
        out.append(src if name == "fn" else src + f"\nfn = {name}\n")
    else:
        out.append(f"fn = ...  # {getattr(fn, '__qualname__', fn)!r}: its source was not found; define it here\n")
    out.append(f"mesh = {mesh_src(mesh)}")
    out.append(f"args = {_tree_src(tuple(args))}")
    out.append(f"in_shardings = {_spec_src(in_shardings)}")
    out.append("f = gp.spmd(fn, mesh, in_shardings=in_shardings)")
    if reference is None:
        out.append("reference = jax.jit(fn)  # fn unpartitioned")
    elif isinstance(reference, str):
        out.append("reference = gpt.jit_reference(fn, mesh, in_shardings)  # jax.jit with the same NamedShardings")
    else:
        rs, rn = function_source(reference)
        out.append((rs.replace("fn = ", "reference = ", 1) if rn == "fn" else rs + f"reference = {rn}\n") if rs
                   else "reference = ...  # the reference= callable: its source was not found")
    out.append("print(f.plan(*args).report())")
    out.append(f"got = apply_mode({mode!r}, f, args)")
    out.append(f"want = apply_mode({mode!r}, reference, args)")
    out.append(f"problems = compare_trees(got, want, apply_mode({mode!r}, fn, args, trace=True), args, tol={tol!r})")
    out.append('print("\\n".join(problems) or "no difference")')
    out.append("assert not problems")
    return "\n".join(out) + "\n"
