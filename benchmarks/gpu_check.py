"""A GPU check, ready to run (issue 38, item 4): gp.spmd against jax.jit with the same shardings
on whatever devices this process has, in a few minutes.

Workloads: the demo (``gspmd_py.demo``'s transformer block and its shardings; also on a (1,)
mesh: ``demo_1dev``), the reference programs (``benchmarks/programs.py``) and a few models of the zoo
(``benchmarks/zoo.py``: data parallel and Megatron hand plans). Each runs on its own mesh when
there are enough devices, else on a mesh of the same axis names with every axis of size 1
(one GPU: every plan is a 1-device plan, the program still goes through gp.spmd's
shard_map). Per workload: the largest difference of the outputs (relative to the largest
reference value), the first call of each side (plan / trace + compile + run) and the per-call
time with inputs already placed (interleaved medians), and the ratio ours / jax.jit.

    python -m benchmarks.gpu_check                     # on a GPU machine: about 2-4 minutes
    python -m benchmarks.gpu_check --tiny              # small shapes (8 CPU devices: ~1 minute)
    python -m benchmarks.gpu_check --tiny --only demo,megatron_mlp --out /tmp/x.md

Writes ``benchmarks/results/gpu_check.md`` (``--out``). A workload not started before
``--budget-s`` (default 200 s) is listed as skipped, so the whole check stays under 5 minutes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Optional

import attrs

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

#: relative output difference above which a row says MISMATCH (f32; GPU matmuls may run in TF32)
REL_TOL = 2e-2


@attrs.frozen
class Workload:
    name: str
    mesh_shape: tuple
    axis_names: tuple
    ours_fn: Callable  # for gp.spmd (gp.annotate inside)
    jit_fn: Callable[[Any], Callable]  # jax mesh -> the function for jax.jit (with_sharding_constraint inside)
    args: Any  # a tuple of arguments (pytrees of numpy arrays)
    in_specs: Any  # gp.P pytree like args (None: replicated / propagation decides)
    out_specs: Any = None


@attrs.frozen
class Result:
    name: str
    mesh: str
    rel_err: float
    first_ours: float
    first_jit: float
    call_ours: float
    call_jit: float
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.call_ours / self.call_jit if self.call_jit > 0 else float("nan")


def _demo(tiny: bool, mesh_shape=(2, 4), names=("x", "y")) -> Workload:
    import numpy as np

    import gspmd_py as gp
    from gspmd_py.demo import transformer_block

    B, T, D, H, K, F = (8, 32, 64, 8, 8, 256) if tiny else (16, 512, 1024, 16, 64, 4096)
    rng = np.random.default_rng(0)
    args = tuple(rng.standard_normal(s).astype(np.float32) * sc for s, sc in [
        ((B, T, D), 1.0), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5),
        ((H, K, D), (H * K) ** -0.5), ((D, F), D ** -0.5), ((F, D), F ** -0.5), ((D,), 1.0), ((D,), 1.0)])
    x, y = names[0], names[-1]
    P = gp.P
    specs = (P(x, None, None), P(None, y, None), P(None, y, None), P(None, y, None), P(y, None, None),
             P(None, y), P(y, None), None, None)
    return Workload("demo" if len(names) > 1 else "demo_1dev", mesh_shape, names, transformer_block,
                    lambda jm: transformer_block, args, specs)


def _programs(tiny: bool) -> list[Workload]:
    from .programs import gp_constrain, jax_constrain_for, programs

    out = []
    for p in programs().values():
        out.append(Workload(p.name, p.mesh_shape, p.axis_names, p.make(gp_constrain),
                            lambda jm, p=p: p.make(jax_constrain_for(jm)), tuple(p.args(quick=True if tiny else False)),
                            p.in_specs, p.out_specs))
    return out


ZOO_MODELS = ("gpt2", "mlp_wide", "moe")


def _zoo(tiny: bool) -> list[Workload]:
    import gspmd_py as gp

    from . import zoo

    out = []
    for name in ZOO_MODELS:
        fn, args, info = zoo.make(name, "tiny" if tiny else "bench")
        shape, names = zoo.MESHES[0]
        plans = zoo.hand_plans(name, gp.Mesh.abstract(shape, names), args, info)
        picked = [k for k in plans if k.startswith(("data parallel (x) + Megatron", "data parallel (x,y)"))
                  and set(plans[k]) == {"in_shardings"}]
        for plan_name in picked[:1 if tiny else 2]:
            kw = plans[plan_name]
            out.append(Workload(f"{name}: {plan_name}", shape, names, fn, lambda jm, fn=fn: fn, tuple(args),
                                    kw["in_shardings"]))
    return out


def workloads(tiny: bool) -> list[Workload]:
    return [_demo(tiny), _demo(tiny, (1,), ("x",))] + _programs(tiny) + _zoo(tiny)


def mesh_shape_for(w: Workload, n_devices: int) -> tuple:
    import numpy as np

    return w.mesh_shape if int(np.prod(w.mesh_shape)) <= n_devices else (1,) * len(w.mesh_shape)


def _named(jm, specs, args, sizes):
    """gp.P pytree -> NamedSharding pytree over ``jm`` (axes that do not divide dropped, as jax.Arrays must)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    import gspmd_py as gp

    from .programs import even_spec

    def one(spec, a):
        return NamedSharding(jm, JP() if spec is None else even_spec(spec, a.shape, sizes))

    is_spec = lambda s: s is None or isinstance(s, gp.P)  # noqa: E731
    return jax.tree_util.tree_map(one, specs, args, is_leaf=is_spec)


def check(w: Workload, n_devices: int, repeats: int) -> Result:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    import gspmd_py as gp

    from .programs import even_spec
    from .timing import interleaved

    shape = mesh_shape_for(w, n_devices)
    sizes = dict(zip(w.axis_names, shape))
    mesh = gp.Mesh(shape, w.axis_names)
    jm = jax.sharding.Mesh(mesh.jax_devices(), w.axis_names)
    t0 = time.perf_counter()
    ours = gp.spmd(w.ours_fn, mesh, in_shardings=w.in_specs, out_shardings=w.out_specs)
    got = jax.block_until_ready(ours(*w.args))
    first_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    jit_out = None
    if w.out_specs is not None:
        ref_shapes = jax.eval_shape(w.ours_fn, *w.args)
        jit_out = jax.tree_util.tree_map(lambda o: NamedSharding(jm, even_spec(w.out_specs, o.shape, sizes)), ref_shapes)
    jitted = jax.jit(w.jit_fn(jm), in_shardings=_named(jm, w.in_specs, w.args, sizes), out_shardings=jit_out)
    want = jax.block_until_ready(jitted(*w.args))
    first_jit = time.perf_counter() - t0
    g_leaves, w_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    scale = max((float(np.max(np.abs(np.asarray(v, np.float64)), initial=0.0)) for v in w_leaves), default=0.0)
    diff = max((float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)), initial=0.0))
                for u, v in zip(g_leaves, w_leaves)), default=0.0)
    rel = diff / scale if scale > 0 else diff
    plan = ours.plan(*w.args)
    leaves, tree = jax.tree_util.tree_flatten(w.args)
    placed_ours = jax.tree_util.tree_unflatten(tree, [
        jax.device_put(a, NamedSharding(plan.jax_mesh, even_spec(s, a.shape, plan.fine.size_of)))
        for a, s in zip(leaves, plan.in_specs)])
    compiled = jitted.lower(*w.args).compile()
    placed_jit = jax.tree_util.tree_map(jax.device_put, tuple(w.args), tuple(compiled.input_shardings[0]))
    t = interleaved({"ours": lambda: jax.block_until_ready(ours(*placed_ours)),
                     "jit": lambda: jax.block_until_ready(jitted(*placed_jit))},
                    repeats=repeats, warmup=1, min_sample_s=0.005)
    note = "" if rel <= REL_TOL else f"MISMATCH: relative difference {rel:.1e} > {REL_TOL:.0e}"
    return Result(w.name, "x".join(map(str, shape)), rel, first_ours, first_jit, t["ours"], t["jit"], note)


def run(tiny: bool, only: Optional[set] = None, budget_s: float = 200.0, log=print) -> tuple[list[Result], list[str]]:
    import jax

    n = len(jax.devices())
    start = time.perf_counter()
    done, skipped = [], []
    for w in workloads(tiny):
        if only and w.name.split(":")[0] not in only and w.name not in only:
            continue
        if time.perf_counter() - start > budget_s:
            skipped.append(w.name)
            continue
        try:
            r = check(w, n, repeats=3 if tiny else 9)
        except Exception as e:  # one failing workload is a row, not the end of the check
            r = Result(w.name, "x".join(map(str, mesh_shape_for(w, n))), float("nan"), float("nan"), float("nan"),
                       float("nan"), float("nan"), f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        log(f"  {r.name:50s} {r.mesh:5s} rel.err {r.rel_err:.1e}  per call {r.call_ours * 1e3:8.3f} ms / "
            f"{r.call_jit * 1e3:8.3f} ms = {r.ratio:5.2f}x {r.note}")
        done.append(r)
    return done, skipped


def report(results: list[Result], skipped: list[str], tiny: bool, seconds: float) -> str:
    import jax

    from .report import md_table
    from .timing import fmt_s

    dev = jax.devices()[0]
    on_gpu = dev.platform == "gpu"
    head = [f"# GPU check: gp.spmd against jax.jit, same shardings (`python -m benchmarks.gpu_check"
            f"{' --tiny' if tiny else ''}`)\n",
            f"{len(jax.devices())} x {dev.device_kind} ({dev.platform}), jax {jax.__version__}, "
            f"Python {sys.version.split()[0]}; ran in {seconds:.0f} s.\n"]
    if not on_gpu:
        head.append("**This file comes from a CPU run; the check has not been run on a GPU yet.** The per-call "
                    "times below are 8 host devices sharing a loaded machine's cores, not a GPU's.\n")
    head.append("Per call: inputs already placed in each side's input shardings, median of interleaved samples. "
                "First call: build the function, plan (ours) or trace (jax.jit), compile, run once, in this "
                "process after the workloads before it (JAX warm). Relative difference: the largest "
                f"|ours - jax.jit| over the largest |jax.jit| output; above {REL_TOL:.0e} the row says MISMATCH.\n")
    rows = [[r.name, r.mesh, f"{r.rel_err:.1e}", fmt_s(r.first_ours), fmt_s(r.first_jit), fmt_s(r.call_ours),
             fmt_s(r.call_jit), f"**{r.ratio:.2f}x**" if r.ratio == r.ratio else "-", r.note] for r in results]
    text = "\n".join(head) + "\n" + md_table(
        ["workload", "mesh", "rel. difference", "first call ours", "first call jit", "per call ours",
         "per call jit", "ours / jit", "note"], rows)
    ok = [r.ratio for r in results if r.ratio == r.ratio]
    if ok:
        text += (f"\n{len(ok)} workloads timed: ours / jax.jit per call median {sorted(ok)[len(ok) // 2]:.2f}x, "
                 f"worst {max(ok):.2f}x; {sum(1 for r in results if r.note)} with a note.\n")
    if skipped:
        text += f"\nSkipped (over the time budget): {', '.join(skipped)}\n"
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="small shapes, few samples (a CPU smoke run)")
    ap.add_argument("--only", default="", help="comma-separated workload names (a zoo model's name selects its plans)")
    ap.add_argument("--budget-s", type=float, default=200.0, help="start no workload after this many seconds")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gpu_check.md"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    only = {s.strip() for s in args.only.split(",") if s.strip()} or None
    results, skipped = run(args.tiny, only, args.budget_s)
    text = report(results, skipped, args.tiny, time.perf_counter() - t0)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        fh.write(text)
    print(text)
    return 0 if results and not any(r.note for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
