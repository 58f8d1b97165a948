"""Plan time against program size (unrolled transformer blocks) and device count (abstract meshes).

Program size: ``n`` transformer blocks (gspmd_py.demo), each with its own weights,
Megatron tensor parallel on y x data parallel on x of a (2, 4) mesh. Per size: jaxpr
eqns, our plan time (trace + propagate + partition + JAX trace of the SPMD body), the
lower and compile time of our program, and XLA's trace + lower and compile of the same
function under ``jax.jit`` with the same shardings.

Device count: one transformer block, the conv net (batch over x, H over y) and a conv
with H over every device (halo tables of one row per device) on ``gp.Mesh.abstract``
meshes of 8 to 8,192 devices (plan + lower; nothing runs), meshes taken round-robin.

    python -m benchmarks --only size,devices --quick
"""
from __future__ import annotations

import cProfile
import io
import pstats
import time

import attrs

from .programs import block_in_specs, block_shapes, even_spec
from .timing import median_time

SIZES = (1, 8, 32, 96)
QUICK_SIZES = (1, 8, 32)
MESHES = ((2, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 128))
# one block's shapes for the size sweep (small: planning time does not depend on them)
_STACK_BLOCK = (8, 64, 256, 8, 32, 1024)


def stacked_blocks(n: int):
    """A fresh function applying ``n`` transformer blocks, and its argument avals and in_specs."""
    import jax
    import jax.numpy as jnp

    from gspmd_py.demo import transformer_block

    def stack(x, *params):
        for i in range(n):
            x = transformer_block(x, *params[8 * i:8 * i + 8])
        return x

    shapes = block_shapes(*_STACK_BLOCK)
    avals = [jax.ShapeDtypeStruct(shapes[0][0], jnp.float32)]
    avals += [jax.ShapeDtypeStruct(s, jnp.float32) for _ in range(n) for s, _ in shapes[1:]]
    specs = block_in_specs()
    return stack, avals, (specs[0],) + tuple(specs[1:]) * n


def count_eqns(jaxpr) -> int:
    """Equations of a jaxpr, nested sub-jaxprs (pjit, custom_jvp, scan bodies) included."""

    def subs(v):
        if isinstance(v, (tuple, list)):
            for u in v:
                yield from subs(u)
        elif hasattr(v, "eqns"):
            yield v
        elif hasattr(getattr(v, "jaxpr", None), "eqns"):
            yield v.jaxpr

    return sum(1 + sum(count_eqns(j) for p in eqn.params.values() for j in subs(p)) for eqn in jaxpr.eqns)


@attrs.define
class SizeRow:
    blocks: int
    eqns: int
    ops: int  # gspmd_py IR ops (after inlining)
    plan_s: float
    lower_s: float = float("nan")
    compile_s: float = float("nan")
    xla_trace_lower_s: float = float("nan")
    xla_compile_s: float = float("nan")

    @property
    def us_per_eqn(self) -> float:
        return self.plan_s / max(self.eqns, 1) * 1e6


def plan_vs_size(sizes, repeats: dict[int, int], compile_up_to: int) -> list[SizeRow]:
    import jax
    from jax.sharding import NamedSharding

    import gspmd_py as gp

    mesh = gp.Mesh((2, 4), ("x", "y"))
    jmesh = jax.sharding.Mesh(mesh.jax_devices(), ("x", "y"))
    rows = []
    for n in sizes:
        fn, avals, specs = stacked_blocks(n)
        eqns = count_eqns(jax.make_jaxpr(fn)(*avals).jaxpr)
        plans = []

        def do_plan():
            f = gp.spmd(stacked_blocks(n)[0], mesh, in_shardings=specs)
            plans.append(f.plan(*avals))

        plan_s = median_time(do_plan, repeats.get(n, 1))
        row = SizeRow(n, eqns, len(plans[-1].graph.ops), plan_s)
        if n <= compile_up_to:
            plan = plans[-1]
            t0 = time.perf_counter()
            lowered = plan.lower()  # Plan -> Lowered: trace and lower (as jax.jit's .trace().lower() below)
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            row.lower_s, row.compile_s = t1 - t0, t2 - t1
            sizes_ = {"x": 2, "y": 4}
            jin = tuple(None if s is None else NamedSharding(jmesh, even_spec(s, a.shape, sizes_))
                        for s, a in zip(specs, avals))
            t0 = time.perf_counter()
            xl = jax.jit(stacked_blocks(n)[0], in_shardings=jin).trace(*avals).lower()
            t1 = time.perf_counter()
            xl.compile()
            t2 = time.perf_counter()
            row.xla_trace_lower_s, row.xla_compile_s = t1 - t0, t2 - t1
        rows.append(row)
    return rows


@attrs.define
class DeviceRow:
    program: str
    mesh: tuple[int, int]
    plan_s: float
    lower_s: float
    collectives: int


def _conv_abstract():
    import jax
    import jax.numpy as jnp

    from .programs import gp_constrain, programs

    prog = programs()["conv_net"]
    n, hw, c = 64, 1024, 16
    S = jax.ShapeDtypeStruct
    avals = [S((n, hw, hw // 16, c), jnp.float32)] + [S((3, 3, c, c), jnp.float32)] * 3
    return (lambda: prog.make(gp_constrain)), avals, prog.in_specs, prog.out_specs


def _conv_all_abstract():
    """One 5x5 SAME conv with H split over every device: the halo tables have a row per device."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import gspmd_py as gp

    def conv_h(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    S = jax.ShapeDtypeStruct
    avals = [S((2, 16 * 8192, 8, 4), jnp.float32), S((5, 5, 4, 4), jnp.float32)]
    spec = gp.P(None, ("x", "y"), None, None)
    return (lambda: (lambda x, w: conv_h(x, w))), avals, (spec, None), spec


def _block_abstract():
    import jax
    import jax.numpy as jnp

    from .programs import _block_fwd, gp_constrain

    avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s, _ in block_shapes(128, 64, 512, 128, 8, 2048)]
    return (lambda: _block_fwd(gp_constrain)), avals, block_in_specs(), None


def plan_vs_devices(meshes, repeats: int) -> list[DeviceRow]:
    """Median plan time per mesh, the meshes taken round-robin (so load drift hits them alike)."""
    import statistics

    import gspmd_py as gp

    rows = []
    for label, build in (("transformer block", _block_abstract), ("conv net", _conv_abstract),
                         ("conv, H over all devices", _conv_all_abstract)):
        make, avals, ins, outs = build()
        abstract = [gp.Mesh.abstract(shape, ("x", "y")) for shape in meshes]
        times: list[list[float]] = [[] for _ in meshes]
        plans: list = [None] * len(meshes)
        for r in range(repeats):
            for j in (range(len(meshes)) if r % 2 == 0 else reversed(range(len(meshes)))):
                f = gp.spmd(make(), abstract[j], in_shardings=ins, out_shardings=outs)
                t0 = time.perf_counter()
                plans[j] = f.plan(*avals)
                times[j].append(time.perf_counter() - t0)
        for j, shape in enumerate(meshes):
            lower_s = median_time(lambda: plans[j].lower_text(), 1)
            rows.append(DeviceRow(label, shape, statistics.median(times[j]), lower_s, len(plans[j].collectives)))
    return rows


def profile_plan(blocks: int, top: int = 30) -> str:
    """cProfile of planning ``blocks`` unrolled blocks: top functions by own and cumulative time."""
    import gspmd_py as gp

    mesh = gp.Mesh((2, 4), ("x", "y"))
    fn, avals, specs = stacked_blocks(blocks)
    gp.spmd(stacked_blocks(1)[0], mesh, in_shardings=stacked_blocks(1)[2]).plan(*stacked_blocks(1)[1])  # warm
    prof = cProfile.Profile()
    f = gp.spmd(fn, mesh, in_shardings=specs)
    t0 = time.perf_counter()
    prof.enable()
    f.plan(*avals)
    prof.disable()
    total = time.perf_counter() - t0
    out = io.StringIO()
    out.write(f"planning {blocks} unrolled transformer blocks: {total:.2f} s under cProfile\n\n")
    for key in ("tottime", "cumulative"):
        out.write(f"--- top {top} by {key} ---\n")
        st = pstats.Stats(prof, stream=out)
        st.strip_dirs().sort_stats(key).print_stats(top)
    return out.getvalue()
