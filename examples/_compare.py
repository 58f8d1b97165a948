"""Shared by the examples: train with gp.spmd and unpartitioned side by side, print both losses.

    worst = compare(spmd_step, plain_step, params, opt_state, batches)   # batches: tuples of step args
"""
from __future__ import annotations


def compare(spmd_step, plain_step, params, opt_state, batches) -> float:
    """Run both steps over ``batches``; print the losses per step; the largest relative difference."""
    p1, s1, p2, s2 = params, opt_state, params, opt_state
    spmd_losses, plain_losses = [], []
    for batch in batches:
        p1, s1, l1 = spmd_step(p1, s1, *batch)
        p2, s2, l2 = plain_step(p2, s2, *batch)
        spmd_losses.append(float(l1))
        plain_losses.append(float(l2))
    print(f"{'step':>4}  {'loss (gp.spmd)':>14}  {'loss (unpartitioned)':>20}")
    for i, (a, b) in enumerate(zip(spmd_losses, plain_losses)):
        print(f"{i:>4}  {a:>14.6f}  {b:>20.6f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(spmd_losses, plain_losses))
    print(f"largest relative difference of the losses: {worst:.1e}")
    return worst
