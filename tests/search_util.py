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
