"""Metamorphic checks: changes that must not change what a partitioned program computes.

    gpt.assert_annotation_invariant(fn, x, w, mesh=mesh)   # gp.annotate on any intermediate: same values
    gpt.assert_device_order_invariant(fn, x, w, mesh=mesh, in_shardings=specs)   # permuted devices: same bits
    gpt.assert_deterministic(fn, x, w, mesh=mesh, in_shardings=specs, processes=2)  # same program text

``assert_annotation_invariant`` traces ``fn`` once, then per example annotates the output of a
drawn equation (``gpt.annotations``: any spec, open dims, priorities) and compares gp.spmd of the
annotated program with ``fn`` unpartitioned (compare.py's rules). ``assert_device_order_invariant``
runs gp.spmd on meshes with the same shape and drawn device orders: the results must be the same
bits as on ``mesh``. ``assert_deterministic`` plans twice here and once in each of ``processes``
fresh Python processes (other hash seeds; ``fn`` must be importable by module and name) and
compares the per-device program text and its StableHLO.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any, Optional

import jax
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..api.api import spmd
from ..core.mesh import Mesh
from . import compare
from .equivalence import compare_trees
from .strategies import annotations, meshes


def _settings(n: int):
    return settings(settings.default, max_examples=n, deadline=None, database=None, report_multiple_bugs=False,
                    suppress_health_check=list(HealthCheck))


def annotated(fn, args, index: int, annotation):
    """``fn`` (traced at ``args``) with ``annotation`` applied to the first output of top-level equation ``index``."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    out_tree = jax.tree_util.tree_structure(out_shape)

    def hook(i, eqn, outs):
        return [annotation.apply(outs[0])] + outs[1:] if i == index else outs

    def g(*xs):
        return jax.tree_util.tree_unflatten(out_tree, compare.interpret(closed, jax.tree_util.tree_leaves(xs), hook))

    g.__name__ = f"{getattr(fn, '__name__', 'fn')}_annotated_at_{index}"
    return g


def assert_annotation_invariant(fn, *args, mesh=None, in_shardings=None, max_examples: int = 20, tol: Any = "auto"):
    """Annotating any intermediate value of ``fn`` never changes what gp.spmd computes (module doc)."""
    closed = jax.make_jaxpr(fn)(*args)
    eqns = [(i, e) for i, e in enumerate(closed.jaxpr.eqns) if e.outvars and hasattr(e.outvars[0].aval, "shape")]
    if not eqns:
        raise ValueError(f"assert_annotation_invariant: {getattr(fn, '__name__', fn)} has no intermediate value")
    want = jax.jit(fn)(*args)
    mesh_st = st.just(mesh) if isinstance(mesh, Mesh) else (mesh or meshes())

    @st.composite
    def examples(draw):
        m = draw(mesh_st)
        i, e = draw(st.sampled_from(eqns))
        return m, i, e, draw(annotations(e.outvars[0].aval.shape, m))

    @_settings(max_examples)
    @given(examples())
    def annotation_invariant(example):
        m, i, e, ann = example
        g = annotated(fn, args, i, ann)
        try:
            got = spmd(g, m, in_shardings=in_shardings)(*args)
            problems = compare_trees(got, want, closed, args, tol)
        except Exception as ex:  # noqa: BLE001 - a crash is a failure too
            problems = [f"gp.spmd raised {type(ex).__name__}: {str(ex)[:2000]}"]
        if problems:
            raise AssertionError(f"{ann.source('y')} on the output y of equation {i} ({e}) of "
                                 f"{getattr(fn, '__name__', 'fn')} on {m} (devices {m.device_ids.reshape(-1).tolist()}),"
                                 f" in_shardings {in_shardings!r}, changed the result:\n  " + "\n  ".join(problems))

    annotation_invariant()


def assert_device_order_invariant(fn, *args, mesh: Mesh, in_shardings=None, max_examples: int = 10):
    """gp.spmd(fn) on ``mesh`` with its devices in another order gives the same bits (module doc)."""
    base = jax.tree_util.tree_leaves(spmd(fn, mesh, in_shardings=in_shardings)(*args))
    ids = mesh.device_ids.reshape(-1).tolist()

    @_settings(max_examples)
    @given(st.permutations(ids))
    def device_order_invariant(order):
        m = Mesh(mesh.shape, mesh.axis_names, devices=list(order))
        got = jax.tree_util.tree_leaves(spmd(fn, m, in_shardings=in_shardings)(*args))
        for i, (g, w) in enumerate(zip(got, base)):
            d, _ = compare.diff(g, w, compare.EXACT, 0.0, 1.0)
            assert not d, (f"gp.spmd({getattr(fn, '__name__', 'fn')}) on {mesh} with devices {list(order)} differs "
                           f"from devices {ids}: output {i}: {d}")

    device_order_invariant()


def _texts(fn, mesh: Mesh, structs, in_shardings) -> tuple[str, str]:
    plan = spmd(fn, mesh, in_shardings=in_shardings).plan(*structs)
    return plan.spmd_text(), plan.lower_text()


def _digest(texts) -> list[str]:
    return [hashlib.sha256(t.encode()).hexdigest() for t in texts]


_CHILD = r'''
import importlib, json, sys, hashlib
import jax, jax.numpy as jnp
import gspmd_py as gp
from gspmd_py.testing.metamorphic import _texts, _digest
spec = json.loads(sys.argv[1])
fn = importlib.import_module(spec["module"])
for part in spec["qualname"].split("."):
    fn = getattr(fn, part)
mesh = gp.Mesh.abstract(tuple(spec["shape"]), tuple(spec["names"]))
structs = [jax.ShapeDtypeStruct(tuple(s), jnp.dtype(d)) for s, d in spec["args"]]
specs = eval(spec["in_shardings"], {"P": gp.P, "None": None})
print(json.dumps(_digest(_texts(fn, mesh, structs, specs))))
'''


def assert_deterministic(fn, *args, mesh: Mesh, in_shardings=None, processes: int = 1,
                         timeout_s: Optional[float] = 300) -> None:
    """The same program text (per-device jaxpr and StableHLO) on every plan, here and in
    ``processes`` fresh processes (module doc)."""
    structs = [jax.ShapeDtypeStruct(np.shape(a), jax.numpy.result_type(a)) for a in args]
    ab = Mesh.abstract(mesh.shape, mesh.axis_names)
    first = _texts(fn, ab, structs, in_shardings)
    again = _texts(fn, ab, structs, in_shardings)
    for what, a, b in zip(("per-device program", "StableHLO"), first, again):
        assert a == b, f"two plans of {getattr(fn, '__name__', 'fn')} on {mesh} gave different {what} text"
    if processes <= 0:
        return
    qual = getattr(fn, "__qualname__", "")
    if "<" in qual or not getattr(fn, "__module__", None) or fn.__module__ == "__main__":
        raise TypeError(f"assert_deterministic(processes={processes}) imports {getattr(fn, '__name__', fn)} in fresh "
                        f"processes: it must be a module-level function of an importable module (not a lambda, "
                        f"a local function or __main__); use processes=0 to compare within this process")
    spec = {"module": fn.__module__, "qualname": qual, "shape": list(mesh.shape), "names": list(mesh.axis_names),
            "args": [[list(s.shape), np.dtype(s.dtype).name] for s in structs],
            "in_shardings": repr(in_shardings).replace("gp.P(", "P(")}
    want = _digest(first)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for k in range(processes):
        env["PYTHONHASHSEED"] = str(1000 + k)
        r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec)], capture_output=True, text=True, env=env,
                           timeout=timeout_s)
        if r.returncode:
            raise AssertionError(f"the planning process {k} failed:\n{r.stderr[-3000:]}")
        got = json.loads(r.stdout.strip().splitlines()[-1])
        for what, a, b in zip(("per-device program", "StableHLO"), want, got):
            assert a == b, (f"process {k} (PYTHONHASHSEED={1000 + k}) planned {getattr(fn, '__name__', 'fn')} "
                            f"on {mesh} with different {what} text")
