"""``res.report()`` for ``gp.auto_shard``: what users read to trust (or not) the plan.

* how the search went: the hardware and why that one, candidates and programs priced, the
  budget that stopped it (a time cap makes the result machine-dependent: said), candidates
  skipped because the partitioner could not build them (how many, why), and whether the
  chosen plan is a fallback (the search's best failed to build as a plan: which, why);
* one table: the chosen plan (built), the best other candidates, and every hand-written plan
  that applies (replicated, data parallel, FSDP, Megatron, data parallel + Megatron, 2D,
  sequence parallel, expert, spatial), each with predicted step, peak memory (and whether it is
  over the limit), collectives and their bytes;
* why the winner won: its step split into compute and communication, the collectives by kind,
  against the best hand plan (how much faster, bytes and memory), and the ops that dominate.
"""
from __future__ import annotations

import re

import jax

from ..core.sharding import P
from .optimizer import bytes_text


def _ms(s: float) -> str:
    return "unbuildable" if s == float("inf") else f"{s * 1e3:.4g} ms"


def _tree_text(t) -> str:
    flat, _ = jax.tree_util.tree_flatten_with_path(t, is_leaf=lambda x: isinstance(x, P))
    return ", ".join(f"{jax.tree_util.keystr(p) or '.'}: {x}" for p, x in flat)


def _short(label: str) -> str:
    """An op's label with source paths cut to their file names."""
    return re.sub(r"/[^\s:()]*/", "", label)[:70]


def _row(name, cand) -> tuple:
    if not cand.built:
        return (name, "unbuildable", "-", "-", "-", cand.text)
    return (name, _ms(cand.price.step_s), bytes_text(cand.price.peak_memory_bytes) + ("" if cand.fits else " (over)"),
            str(cand.price.collectives), bytes_text(cand.price.comm_bytes), cand.text)


def header(res) -> list[str]:
    s = res.search
    lines = [f"gp.auto_shard of {res.plan.fn_name} on {res.plan.mesh} ({res.hardware_text or s.hardware}): "
             f"{s.explored} candidates, {s.programs} programs priced in {s.seconds:.2f} s; searched axes "
             f"{', '.join(s.axes) or 'none (a pipeline took every mesh axis)'}" + (f"; memory limit {bytes_text(s.memory_limit)}" if s.memory_limit else "")]
    if s.stopped_by == "time":
        lines.append(f"search stopped by the time cap (time_budget_s) before max_evaluations={s.max_evaluations}: "
                     f"this result depends on the machine's speed; raise time_budget_s for a reproducible one")
    elif s.stopped_by == "evaluations":
        lines.append(f"search stopped at max_evaluations={s.max_evaluations} candidates (deterministic budget)")
    else:
        lines.append(f"search converged before its budgets (max_evaluations={s.max_evaluations}, the time cap "
                     f"time_budget_s): the result depends on the inputs, the hardware and the seed only")
    lines += exact_lines(res)
    if res.fallback:
        lines.append(res.fallback)
    if s.skipped:
        n = sum(k for _, k in s.skipped)
        lines.append(f"skipped {n} candidate{'s' if n != 1 else ''} the partitioner could not build: "
                     + "; ".join(f"{k} x {r}" for r, k in s.skipped))
    return lines


def exact_lines(res) -> list[str]:
    """The exact search (search/exact.py): what it did, whether its plan or the fallback search's
    won; the measured tie-break; the training loop's returned state; the search's time split."""
    s = res.search
    lines = []
    ex = getattr(s, "exact", None)
    if ex is not None:
        lines.append(ex.text())
        cand = s.exact_candidate
        if cand is not None:
            won = cand.actions == s.best.actions
            lines.append(f"  its plan priced {_ms(cand.price.step_s)}: " + (
                "chosen" if won else f"the fallback search (start states and hill climbing) found a better one, "
                                     f"{_ms(s.best.price.step_s)}"))
    m = getattr(res, "measured", None)
    if m is not None and (m.texts or m.note):
        lines.append(m.text() + (f"; {m.note}" if m.texts and m.note else ""))
    for what, a, b, sec in getattr(s, "relayouts", ()):
        lines.append(f"returned state {what} comes back {b}, given {a}: a training loop re-lays it out each step "
                     f"({_ms(sec)} by the cost tables); the plan's other choices priced lower with it")
    if getattr(res, "times", ()):
        cpu = [f"{k} {v:.2f} s" for k, v in res.times if k != "measure"]
        wall = [f"{k} {v:.2f} s" for k, v in res.times if k == "measure"]
        lines.append("search time: " + ", ".join(cpu) + " (CPU seconds of this process)"
                     + (", " + ", ".join(wall) + " (wall)" if wall else ""))
    return lines


def why(res) -> list[str]:
    """Why the chosen plan won: its dominant terms, against the best hand-written plan."""
    c, s = res.cost, res.search
    kinds = ", ".join(f"{k} {bytes_text(v)}" for k, v in c.comm_bytes_by_kind.items()) or "none"
    lines = [f"why this plan: step {_ms(c.step_s)} = compute {_ms(c.compute_s)} + communication {_ms(c.comm_s)}"
             f" (serial {_ms(c.step_serial_s)}); collectives: {kinds}; peak memory {bytes_text(c.peak_memory_bytes)}"]
    hand = [(n, h) for n, h in s.baselines if h.built and h.fits]
    if hand:
        name, h = min(hand, key=lambda t: (t[1].price.step_s, t[0]))
        if s.best.actions == h.actions:
            lines.append(f"  it is the hand-written plan {name}: nothing the search tried beat it")
        else:
            ratio = h.price.step_s / c.step_s if c.step_s > 0 else 1.0
            lines.append(f"  vs the best hand-written plan that fits, {name} ({_ms(h.price.step_s)}): {ratio:.3g}x its "
                         f"speed; collective bytes {bytes_text(c.comm_bytes)} vs {bytes_text(h.price.comm_bytes)}; "
                         f"peak memory {bytes_text(c.peak_memory_bytes)} vs {bytes_text(h.price.peak_memory_bytes)}")
    elif s.baselines:
        lines.append("  no hand-written plan fits" + (f" the memory limit ({bytes_text(s.memory_limit)})"
                                                      if s.memory_limit else " (or builds)"))
    total = max(c.step_serial_s, 1e-30)
    ops = sum(o.total_s for o in c.ops)
    if ops < 0.5 * total:
        lines.append(f"  fixed costs dominate: the ops take {100 * ops / total:.0f}% of the step (the rest is per-step "
                     f"and per-kernel overhead on {c.hardware}: too small a program to gain from splitting much)")
    top = sorted(c.ops, key=lambda o: (-o.total_s, o.key))[:3]
    if top:
        lines.append("  dominant terms: " + "; ".join(
            f"{_short(o.label)} {_ms(o.total_s)} ({100 * o.total_s / total:.0f}%"
            + (", " + ", ".join(str(x.collective.kind) for x in o.collectives) if o.collectives else "") + ")"
            for o in top))
    return lines


def pipelines(res) -> list[str]:
    """The open pipelines' section (api/auto_pipeline.py): the schedule chosen or why none was,
    and every program priced for them (no pipeline, each schedule: screened, searched, skipped)."""
    if not res.pipelines:
        return []
    lines = [res.pipeline_text, "  programs priced for the open pipelines (screened: a search of a few "
                                "candidates; searched: the full search):"]
    rows = []
    for t in res.pipelines:
        chosen = (t.axis, t.microbatches) == ((res.pipeline.axis, res.pipeline.microbatches)
                                              if res.pipeline is not None else ("", 0))
        step, peak = ("-", "-") if t.stage == "skipped" else (_ms(t.step_s), bytes_text(t.peak_bytes))
        bubble = f"bubble {t.schedule.bubble:.1%}" if t.schedule is not None else ""
        rows.append((("* " if chosen else "  ") + t.name, t.stage, step, peak, bubble, t.note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("    " + "  ".join(x.ljust(w) for x, w in zip(r[:5], widths)) + ("  " + r[5] if r[5] else ""))
    return lines


def report(res) -> str:
    s = res.search
    lines = header(res)
    rows = [("plan", "step", "peak memory", "collectives", "bytes", "decisions")]
    c = res.cost
    rows.append(("chosen (built)", _ms(c.step_s), bytes_text(c.peak_memory_bytes), str(len(res.plan.collectives)),
                 bytes_text(c.comm_bytes), s.best.text))
    for i, cand in enumerate(s.top):
        rows.append(_row(f"candidate {i + 1}", cand))
    for name, cand in s.baselines:
        r = _row(f"hand: {name}", cand)
        rows.append(r[:5] + (r[5] if r[5] else "",))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        lines.append("  " + "  ".join(x.ljust(w) for x, w in zip(r[:5], widths)) + "  " + r[5])
    lines += why(res)
    lines += pipelines(res)
    lines.append("in_shardings: " + _tree_text(res.in_shardings))
    lines.append("replay: gp.spmd(fn, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings, "
                 "tactics=res.rules())" + (f" (starts with {res.pipeline}: the schedule changes the traced program)"
                                           if res.pipeline is not None else "")
                 + "; under jax.jit: res.jax_shardings().jit()")
    return "\n".join(lines)
