"""Helpers the search's tests share."""
from __future__ import annotations

import gspmd_py.search.price as price_mod
from gspmd_py.search import optimizer


def favour_intermediates(monkeypatch) -> None:
    """Make intermediate annotations attractive: a candidate seeding any non-input value is
    priced at a quarter of its step, and every neighbour is priced (no tables' pre-screen),
    so the search's plan carries intermediate annotations."""
    real = price_mod.Pricer.price

    def price(self, seeds, prop=None):
        got, prop = real(self, seeds, prop)
        if any(s.value.producer is not None for s in seeds):
            got = type(got)(got.step_s * 0.25, got.peak_memory_bytes, got.comm_bytes, got.collectives)
        return got, prop

    monkeypatch.setattr(price_mod.Pricer, "price", price)
    monkeypatch.setattr(optimizer, "SCREEN", False)


def tactic_context(fn, mesh, *args):
    """The TacticContext a tactic sees for ``fn(*args)`` (pytree arguments flattened, each
    leaf's argument number and key path kept): what the exact search's tests price."""
    import jax

    from gspmd_py.compiler import fold_shifts, trace
    from gspmd_py.frontend.rules import slash_path
    from gspmd_py.search.context import Leaf, TacticContext

    flat, _ = jax.tree_util.tree_flatten_with_path(args)
    tree = jax.tree_util.tree_structure(args)
    leaves = [Leaf(p[0].idx, slash_path(p[1:]), f"arg{p[0].idx}{jax.tree_util.keystr(p[1:])}") for p, _ in flat]
    closed = jax.make_jaxpr(lambda *xs: fn(*jax.tree_util.tree_unflatten(tree, xs)))(*[x for _, x in flat])
    graph = fold_shifts(trace(closed, mesh, [lf.name for lf in leaves]))
    return TacticContext(graph, mesh, leaves, [], args)
