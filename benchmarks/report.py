"""Markdown tables and PNG plots of the benchmark results (plots need matplotlib: ``pip install -e .[bench]``).

    >>> md_table(["a", "b"], [[1, 2]])
    '| a | b |\\n|---|---|\\n| 1 | 2 |\\n'
"""
from __future__ import annotations

import os
from typing import Sequence

from .timing import fmt_s


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = "| " + " | ".join(header) + " |\n" + "|" + "---|" * len(header) + "\n"
    for r in rows:
        out += "| " + " | ".join(str(c) for c in r) + " |\n"
    return out


def ratio(a: float, b: float) -> str:
    return "-" if a != a or b != b or b == 0 else f"{a / b:.2f}x"


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 else f"{n / 2 ** 10:.1f} KiB"


def calls_table(results, cold) -> str:
    rows = []
    for r in results:
        c = cold.get(r.name, {})
        rows.append([
            r.title,
            f"{fmt_s(r.numpy_ours)} / {fmt_s(r.numpy_jit)} = **{ratio(r.numpy_ours, r.numpy_jit)}**",
            f"{fmt_s(r.placed_ours)} / {fmt_s(r.placed_jit)} = **{ratio(r.placed_ours, r.placed_jit)}**",
            f"{fmt_s(r.first_ours)} / {fmt_s(r.first_jit)} = **{ratio(r.first_ours, r.first_jit)}**",
            f"{fmt_s(c['ours'])} / {fmt_s(c['jit'])} = **{ratio(c['ours'], c['jit'])}**" if c else "-",
            f"{r.colls_ours[2]} ({_mib(r.colls_ours[1])})",
            f"{r.colls_xla[2]} ({_mib(r.colls_xla[1])})",
        ])
    return md_table(["program", "per call, numpy in (ours / jit)", "per call, placed in",
                     "first call, warm process", "first call, fresh process", "collectives ours",
                     "collectives XLA"], rows)


def calls_detail(results) -> str:
    m = lambda r, a, b: ratio(r.mins.get(a, float("nan")), r.mins.get(b, float("nan")))  # noqa: E731
    rows = [[r.title, m(r, "numpy_ours", "numpy_jit"), m(r, "placed_ours", "placed_jit"),
             f"{r.colls_ours[0]} / {_mib(r.colls_ours[1])}",
             f"{r.colls_ours_hlo[0]} / {_mib(r.colls_ours_hlo[1])} ({r.colls_ours_hlo[2]})",
             f"{r.colls_xla[0]} / {_mib(r.colls_xla[1])}", f"{r.max_abs_err:.1e}"] for r in results]
    return md_table(["program", "per call, numpy in: fastest sample ratio", "placed in: fastest sample ratio",
                     "ours: plan.collectives (ops / bytes per device)", "ours: in our compiled HLO",
                     "XLA: in its compiled HLO", "max |ours - jit|"], rows)


def size_table(rows) -> str:
    out = []
    for r in rows:
        ours_first = r.plan_s + r.lower_s + r.compile_s
        xla_first = r.xla_trace_lower_s + r.xla_compile_s
        out.append([r.blocks, r.eqns, r.ops, fmt_s(r.plan_s), f"{r.us_per_eqn:.0f}", fmt_s(r.lower_s),
                    fmt_s(r.compile_s), fmt_s(r.xla_trace_lower_s), fmt_s(r.xla_compile_s),
                    f"{fmt_s(ours_first)} / {fmt_s(xla_first)} = {ratio(ours_first, xla_first)}"])
    return md_table(["blocks", "jaxpr eqns", "IR ops", "plan", "us / eqn", "our lower", "our compile",
                     "XLA trace+lower", "XLA compile", "trace-to-executable ours / XLA"], out)


def devices_table(rows) -> str:
    base = {}
    out = []
    for r in rows:
        n = r.mesh[0] * r.mesh[1]
        base.setdefault(r.program, r.plan_s)
        out.append([r.program, f"{r.mesh[0]}x{r.mesh[1]}", n, fmt_s(r.plan_s), ratio(r.plan_s, base[r.program]),
                    fmt_s(r.lower_s), r.collectives])
    return md_table(["program", "mesh", "devices", "plan", "plan / plan at 8", "lower", "collectives"], out)


def plots(outdir: str, calls=None, size_rows=None, device_rows=None) -> list[str]:
    """Write PNG plots; returns the files written ([] without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    if calls:
        fig, ax = plt.subplots(figsize=(8, 3.6))
        names = [r.title for r in calls]
        keys = [("numpy_ours", "numpy_jit", "per call, numpy in"), ("placed_ours", "placed_jit", "per call, placed in"),
                ("first_ours", "first_jit", "first call")]
        w = 0.27
        for j, (a, b, label) in enumerate(keys):
            ax.bar([i + (j - 1) * w for i in range(len(names))], [getattr(r, a) / getattr(r, b) for r in calls], w,
                   label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        written.append(_save(fig, ax, "gspmd_py / jax.jit (lower is better)", outdir, "calls.png"))
    if size_rows:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        ax.plot([r.eqns for r in size_rows], [r.plan_s for r in size_rows], "o-", label="gspmd_py plan")
        xr = [r for r in size_rows if r.xla_trace_lower_s == r.xla_trace_lower_s]
        ax.plot([r.eqns for r in xr], [r.xla_trace_lower_s for r in xr], "s--", label="XLA trace+lower")
        ax.plot([r.eqns for r in xr], [r.xla_compile_s for r in xr], "^--", label="XLA compile")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("jaxpr eqns (1 to 96 unrolled blocks)")
        written.append(_save(fig, ax, "seconds", outdir, "plan_vs_size.png"))
    if device_rows:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for prog in dict.fromkeys(r.program for r in device_rows):
            rs = [r for r in device_rows if r.program == prog]
            ax.plot([r.mesh[0] * r.mesh[1] for r in rs], [r.plan_s for r in rs], "o-", label=prog)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("devices (abstract mesh)")
        ax.set_ylim(bottom=0)
        written.append(_save(fig, ax, "plan seconds", outdir, "plan_vs_devices.png"))
    return written


def _save(fig, ax, ylabel: str, outdir: str, name: str) -> str:
    """Label the y axis, add the legend, lay out, write ``outdir/name`` and close the figure."""
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(outdir, name)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
