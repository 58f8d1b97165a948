"""Between the compiler's passes (gspmd_py/views/pass_check.py): GSPMD_PY_DUMP writes each
pass's output as text under deterministic names; the verifier (GSPMD_PY_VERIFY, on in
tests) catches a pass that breaks an invariant the next one relies on."""
from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.partitioner.diagnostics import Held
from gspmd_py.partitioner.pvalue import Partial
from gspmd_py.views import pass_check
from gspmd_py.views.pass_check import PassInvariantError

P = gp.P
MESH = gp.Mesh.abstract((2, 4), ("x", "y"))
S = jax.ShapeDtypeStruct
ARGS = (S((8, 16), jnp.float32), S((16, 32), jnp.float32), S((32, 16), jnp.float32))


def mlp(x, w1, w2):
    x = gp.annotate(x, P("x", None))
    w1 = gp.annotate(w1, P(None, "y"))
    h = gp.tag(jax.nn.relu(x @ w1), "hidden")
    return h @ gp.annotate(w2, P("y", None))


def test_dump_writes_each_pass_in_order_under_deterministic_names(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPMD_PY_DUMP", str(tmp_path / "a"))
    compiler.plan_jaxpr(jax.make_jaxpr(mlp)(*ARGS), MESH, name="mlp")
    monkeypatch.setenv("GSPMD_PY_DUMP", str(tmp_path / "b"))
    compiler.plan_jaxpr(jax.make_jaxpr(mlp)(*ARGS), MESH, name="mlp")
    [folder] = (tmp_path / "a").iterdir()
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"{i + 1:02d}-{n}.txt" for i, n in enumerate(p.name for p in compiler.PASSES)] + ["11-collectives.txt"]
    again = tmp_path / "b" / folder.name  # the same program: the same folder and files, the same text
    assert all((folder / n).read_text() == (again / n).read_text() for n in names)
    assert "[{x}, {y}] = gspmd_tag[name=hidden]" in (folder / "05-propagate.txt").read_text()
    assert "all-reduce(y) sum 256B" in (folder / "09-reindex.txt").read_text()
    assert (folder / "11-collectives.txt").read_text().startswith("all-reduce(y) 256B  <- output boundary #")


def _passes():
    graph = compiler.fold_shifts(compiler.trace(jax.make_jaxpr(mlp)(*ARGS), MESH))
    s = compiler.seed(graph, MESH)
    prop = compiler.propagate(graph, MESH, s.seeds)
    part = compiler.partition(graph, MESH, prop)
    return graph, prop, part, compiler.index(part.program, part.fine, graph)


def test_the_verifier_passes_a_sound_plan_and_names_a_value_without_a_sharding():
    graph, prop, part, idx = _passes()
    for name, result in (("propagate", prop), ("partition", part), ("index", idx)):
        pass_check.verify(name, result, MESH, graph=graph)
    v = next(v for v in graph.values() if v.name == "hidden")
    broken = attrs.evolve(part, shardings={k: s for k, s in part.shardings.items() if k != v.id})
    with pytest.raises(PassInvariantError, match=f"partition: value %{v.id}<hidden> f32.8,32. has no sharding"):
        pass_check.verify("partition", broken, MESH, graph=graph)


def test_the_verifier_refuses_an_output_left_partial():
    graph, prop, part, idx = _passes()
    out = graph.outputs[0]
    held = dict(part.diagnostics.held)
    held[out.id] = Held((4, 16), ((), ()), Partial(("y",), "sum"))
    broken = attrs.evolve(part, diagnostics=attrs.evolve(part.diagnostics, held=held))
    with pytest.raises(PassInvariantError, match="returned as a partial sum"):
        pass_check.verify("partition", broken, MESH, graph=graph)


def test_the_verifier_refuses_a_partial_over_an_axis_its_dims_are_sharded_over():
    graph, prop, part, idx = _passes()
    v = next(v for v in graph.values() if v.name == "hidden")
    held = dict(part.diagnostics.held)
    held[v.id] = Held((4, 8), (("x",), ("y",)), Partial(("y",), "sum"))
    broken = attrs.evolve(part, diagnostics=attrs.evolve(part.diagnostics, held=held))
    with pytest.raises(PassInvariantError, match="count a shard twice"):
        pass_check.verify("partition", broken, MESH, graph=graph)


def test_the_verifier_refuses_a_collective_without_its_record():
    graph, prop, part, idx = _passes()
    entries = [attrs.evolve(e, collectives=()) if e.collectives else e for e in idx.entries]
    assert entries != list(idx.entries)
    broken = attrs.evolve(idx, entries=tuple(entries))
    with pytest.raises(PassInvariantError, match="psum.*0 collective records, expected 1"):
        pass_check.verify("index", broken, MESH, graph=graph)
