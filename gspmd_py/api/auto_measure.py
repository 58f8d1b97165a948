"""``gp.auto_shard(..., measure=k)``: measured tie-breaks where the mesh is real (issue 37).

When the mesh's devices are this process's (a concrete ``gp.Mesh``, every device addressable)
and the plans are priced for those devices (``hardware=None``: their preset or this machine
calibrated), the best ``k`` candidates the cost model cannot separate (predicted within
``TIE`` of the best) are compiled and timed on arguments of the traced shapes (zeros where
the caller passed ``jax.ShapeDtypeStruct``), interleaved (one run of each per round, the order
rotated each round) and repeated until the ranking of their medians has not changed for
``STABLE`` rounds (at least ``MIN_ROUNDS``, at most ``MAX_ROUNDS``). The model's choice is
replaced only by a candidate measured faster by ``MARGIN`` at the median that won in at least
``WINS`` of the rounds: noise on a loaded machine does not move the choice. An abstract mesh,
or a hardware given for other devices: the cost model alone decides (the report says why).

The measured steps are appended to ``measured.jsonl`` in the calibration cache's folder
(cost/machine.py ``cache_dir``) when that folder exists (a calibrated CPU wrote it): the
program, the mesh, each candidate's predicted and measured step.

``TIMER(run, label) -> seconds`` times one call (``run`` blocks until the outputs are ready);
tests replace it to construct a case.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Optional, Sequence

import attrs
import jax
import numpy as np

TIE = 0.03  # candidates predicted within 3% of the best are ones the model cannot separate
MARGIN = 0.10  # the measured best replaces the model's only when 10% faster at the median...
WINS = 0.8  # ...and fastest in at least 4 rounds of 5 (5% and 3 of 4 moved a tiny mlp's choice on a loaded machine)
MIN_ROUNDS, MAX_ROUNDS, STABLE = 5, 11, 3


def _time_one(run: Callable[[], None], label: str) -> float:
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


TIMER: Callable[[Callable[[], None], str], float] = _time_one


@attrs.frozen
class Measured:
    """What measurement did: each candidate's text, predicted and measured (median) step,
    the rounds, which one was chosen, and why (or why nothing was measured)."""

    texts: tuple[str, ...] = ()
    predicted_s: tuple[float, ...] = ()
    measured_s: tuple[float, ...] = ()
    rounds: int = 0
    chosen: int = 0  # index into texts: 0 is the model's choice
    note: str = ""
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return self.chosen != 0

    def text(self) -> str:
        if not self.texts:
            return f"measurement: none ({self.note})" if self.note else ""
        rows = "; ".join(f"{i + 1}. predicted {p * 1e3:.4g} ms, measured {m * 1e3:.4g} ms"
                         for i, (p, m) in enumerate(zip(self.predicted_s, self.measured_s)))
        head = (f"measurement changed the choice: candidate {self.chosen + 1} ({self.texts[self.chosen]}) measured "
                f"fastest, over the model's choice" if self.changed else
                "measurement kept the model's choice")
        return f"{head} ({len(self.texts)} candidates the model could not separate, {self.rounds} interleaved rounds: {rows})"


def why_not(mesh, hardware_given: bool) -> str:
    """'' when measurement may run on ``mesh``; else why the cost model alone decides."""
    if mesh.is_abstract:
        return "an abstract mesh: the cost model alone decides"
    if hardware_given:
        return "the plans are priced for the hardware given, not for this machine's devices"
    me = jax.process_index()
    if any(d.process_index != me for d in mesh.jax_devices().reshape(-1)):
        return "the mesh's devices are not all this process's"
    return ""


def concrete(args):
    """``args`` with every ``jax.ShapeDtypeStruct`` replaced by zeros of its shape and dtype."""
    return jax.tree_util.tree_map(lambda a: np.zeros(a.shape, a.dtype) if isinstance(a, jax.ShapeDtypeStruct) else a,
                                  args)


def measure(runs: Sequence[Callable[[], None]], texts: Sequence[str], predicted: Sequence[float]) -> Measured:
    """Time ``runs`` (compiled, warmed once each) interleaved until stable (module docstring);
    index 0 is the model's choice."""
    t0 = time.perf_counter()
    for r in runs:  # compile and warm
        r()
    times: list[list[float]] = [[] for _ in runs]
    wins = [0] * len(runs)
    ranks: list = []
    n = 0
    while n < MAX_ROUNDS:
        order = [(n + i) % len(runs) for i in range(len(runs))]
        got = {}
        for i in order:
            got[i] = TIMER(runs[i], texts[i])
            times[i].append(got[i])
        wins[min(got, key=lambda i: (got[i], i))] += 1
        n += 1
        ranks.append(tuple(np.argsort([np.median(t) for t in times], kind="stable")))
        if n >= MIN_ROUNDS and len(set(ranks[-STABLE:])) == 1:
            break
    med = [float(np.median(t)) for t in times]
    best = min(range(len(runs)), key=lambda i: (med[i], i))
    chosen = best if best != 0 and med[best] <= (1 - MARGIN) * med[0] and wins[best] >= WINS * n else 0
    return Measured(tuple(texts), tuple(float(p) for p in predicted), tuple(med), n, chosen,
                    seconds=time.perf_counter() - t0)


def record(res_name: str, mesh, hw_name: str, m: Measured) -> Optional[str]:
    """Append ``m`` to the calibration cache's ``measured.jsonl`` when the cache folder exists;
    the path written, or None."""
    from ..cost.machine import cache_dir

    folder = cache_dir()
    if not m.texts or not os.path.isdir(folder):
        return None
    path = os.path.join(folder, "measured.jsonl")
    row = {"program": res_name, "mesh": [list(mesh.shape), list(mesh.axis_names)], "hardware": hw_name,
           "candidates": [{"plan": t, "predicted_s": p, "measured_s": s}
                          for t, p, s in zip(m.texts, m.predicted_s, m.measured_s)], "chosen": m.chosen}
    try:
        with open(path, "a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
    except OSError:
        return None
    return path
