"""``gp.Hardware.calibrate(mesh)``: measure this machine, over ``mesh``'s devices, in a few seconds.

Every probe runs one small program on all devices of the mesh at once (``jax.shard_map``),
so the rates are what each device gets while all of them work, as in a real step (on a
CPU host, 8 "devices" share the host's cores):

* per-step overhead: a program that does nothing (launching the devices' programs);
  every other probe's time is taken net of it;
* matmul FLOP/s: the harmonic mean of the rates of f32 matmuls of four shapes that
  partitioned programs run (square, wide, a skinny data-parallel shard with 32 rows, a batch
  of small attention-head products): a host's GEMM efficiency varies 2x with shape, and one
  rate must serve them all (the "large" class); per-kernel overhead:
  a chain of 32 tiny dependent matmuls;
* per-shape-class rates (rates.py): matmuls of the small (64^3) and medium (128 x 128 x 256)
  classes as fractions of that rate (net of their kernels' overhead; a smaller class is
  never faster than a larger one); one 3x3 conv per conv class (few or many channels, small or
  large image: ``CONV_PROBES``), each as a fraction of the matmul rate, and a 3x3 conv's
  weight gradient at a local batch of 1 and 8 (``WGRAD_PROBES``); reductions' bandwidth:
  row sums over a 16 MiB f32 array;
* memory bandwidth: ``x * a + x[::-1] * b`` over a 16 MiB f32 vector per device (12 bytes
  per element); vector FLOP/s: a fused chain of 16 multiply-adds per element; transcendental
  cost: ``tanh`` per element, in vector FLOPs;
* per mesh axis, each collective (all-gather, reduce-scatter, all-reduce, all-to-all,
  collective-permute) at sizes from 16 KiB to 32 MiB per device (``SIZES``), 8 times in a
  chain (the launch is paid once; 2 times above 2 MiB), the sizes above 2 MiB bounded in
  time (``LARGE_BUDGET_S`` per round: ``measure``); alpha
  and beta are fitted by non-negative least squares on relative error (each row divided by
  its time) to the formulas the model prices with (collectives.py):
  ``t = a_k(p) * alpha + b_k(p, n) / beta``, over all kinds
  (the link's alpha and beta) and for each kind on its own (``Link.per_kind``: a CPU
  host's all-to-all, for one, is far slower than its all-gather at equal bytes).

Compute probes repeat their step so that each runs for tens of milliseconds, as a program
does: on a shared host a short burst gets more of the cores than a long run (XLA fuses the
repeated elementwise steps into one kernel, which is fine for FLOP rates).
Each probe is compiled once; ``reps`` rounds run every probe once each (round-robin, so a
change of machine load hits every probe alike) and the median per probe counts.
``Calibrator`` exposes the rounds so that a benchmark can interleave them with its own
measurements (benchmarks/cost_validation.py does).

    >>> hw = gp.Hardware.calibrate(gp.Mesh((2, 4), ("x", "y")))      # doctest: +SKIP
    >>> hw.topology.link("y")                                           # doctest: +SKIP
    Link(alpha=0.00012, beta=1.5e9, name='y', all_to_all='switch')
"""
from __future__ import annotations

import functools
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

import attrs
import numpy as np

from ..core.errors import ShardingError
from ..core.mesh import Mesh
from ..ops.collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE, REDUCE_SCATTER
from .collectives import collective_time
from .topology import Level, Link, PerAxis

# progress, through the standard logging module: INFO lines under "gspmd_py" (shown once the
# application configures logging, e.g. logging.basicConfig(level=logging.INFO); silenced by
# logging.getLogger("gspmd_py").setLevel(logging.WARNING))
log = logging.getLogger("gspmd_py.calibrate")
KINDS = (ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE)
# (batch, m, k, n) per device: the shapes partitioned programs run: square, wide, skinny (a
# data-parallel shard of a batch), batched small (attention heads)
MATMULS = ((1, 256, 512, 512), (1, 128, 512, 512), (1, 32, 512, 1024), (16, 128, 32, 128))
MATMUL_FLOPS = 2 ** 28  # FLOPs per device of one matmul probe (the shape repeated)
# per-shape-class rates (rates.py). Matmul classes by FLOPs per product: (class bound, probe
# (batch, m, k, n), the probe's FLOPs): the shapes above are the "large" class (the peak)
MATMUL_CLASSES = ((2 ** 20, (1, 64, 64, 64), 2 ** 24), (2 ** 23, (1, 128, 128, 256), 2 ** 26))
# conv classes (rates.conv_class): one 3x3 SAME conv, NHWC, C in = C out, per class: (H = W, C), each at
# the low end of its class (16 of 1-31 channels, 32 of 32 and more; 16 x 16 or 32 x 32 pixels)
CONV_PROBES = (("small-c/small-hw", 16, 16), ("small-c/large-hw", 64, 16), ("large-c/small-hw", 16, 32),
               ("large-c/large-hw", 32, 32))
# weight-gradient classes (rates.conv_class): the kernel's gradient of a 3x3 SAME conv, NHWC, C in =
# C out: (class, local batch f, H = W, C): "wgrad/small-f" at f = 1 on a large image (its efficiency
# is per contracted feature), "wgrad/large-f" at f = 8
WGRAD_PROBES = (("wgrad/small-f", 1, 64, 16), ("wgrad/large-f", 8, 32, 16))
CONV_FLOPS = 2 ** 25  # about this many FLOPs per device per conv probe step (the batch chosen so)
CONV_SUSTAIN = 2  # steps per conv probe
# a class's measured rate as a fraction of the matmul rate (the harmonic mean over shapes) is
# kept within [0.01, MAX_EFFICIENCY]: a conv with many channels may beat that mean (a host's
# im2col GEMM is square and large)
MAX_EFFICIENCY = 2.0
ELEMS = 2 ** 20  # f32 elements per device for the vector / tanh probes (4 MiB)
MEM_ELEMS = 2 ** 22  # f32 elements per device for the memory probe (16 MiB: no cache holds 8 of them)
REPEAT = 8  # a collective probe runs its collective this many times in a chain
BASE_SIZES = (2 ** 14, 2 ** 17, 2 ** 21)  # bytes per device: Calibrator's default collective sizes
# gp.Hardware.calibrate's default: the base sizes, then 8 and 32 MiB (programs move tens of MiB,
# and a host's large transfers leave the alpha-beta line its small ones draw), time-bounded:
SIZES = BASE_SIZES + (2 ** 23, 2 ** 25)
LARGE = 2 ** 21  # probes above this many bytes run LARGE_REPEAT collectives (launch cost is noise there)
LARGE_REPEAT = 2
# seconds per round for the large probes (measure: sizes past it are dropped). Measured on this
# shared 2-core host, (2, 4) mesh of CPU devices: 8 MiB fits (a round of its 10 probes about
# 0.7-1 s), 32 MiB would not (predicted 3-4 s a round), and is extrapolated; calibration took
# 6.2-7.5 s against 3.6-7.9 s with the base sizes alone (interleaved); a budget of 3 s kept the
# same sizes in 13-15 s
LARGE_BUDGET_S = 1.5
TINY = 32  # tiny dependent matmuls in the kernel-overhead probe
REDUCE_ROW = 256  # the reduction probe sums rows of this many f32 elements
SUSTAIN = 4  # the other compute probes repeat their step this many times (unfused)


@attrs.frozen
class Measured:
    """What calibration measured: the fields of a ``gp.Hardware`` (``Hardware.from_measured``)."""

    name: str
    matmul_flops: tuple[tuple[str, float], ...]
    vector_flops: float
    mem_bandwidth: float
    mem_capacity: float
    topology: PerAxis
    transcendental_flops: float = 1.0
    conv_efficiency: float = 1.0
    op_overhead: float = 0.0
    step_overhead: float = 0.0
    matmul_classes: tuple[tuple[float, float], ...] = ()
    conv_classes: tuple[tuple[str, float], ...] = ()
    reduce_bandwidth: float = 0.0


@attrs.define
class Probe:
    name: str
    fn: Callable
    args: tuple
    info: tuple = ()
    times: list = attrs.Factory(list)

    def run(self) -> float:
        import jax

        t0 = time.perf_counter()
        jax.block_until_ready(self.fn(*self.args))
        t = time.perf_counter() - t0
        self.times.append(t)
        return t

    @property
    def median(self) -> float:
        return float(np.median(self.times))


class Calibrator:
    """The probes of one mesh, compiled; ``sample()`` runs a round, ``fit()`` says what they measured."""

    def __init__(self, mesh: Mesh, sizes: Sequence[int] = BASE_SIZES):
        import jax
        import jax.numpy as jnp
        from jax import lax
        from jax.sharding import Mesh as JMesh, NamedSharding, PartitionSpec as JP

        if mesh.is_abstract:
            raise ShardingError(f"{mesh} is abstract: calibration needs devices to run on")
        self.mesh = mesh
        jm = JMesh(mesh.jax_devices(), mesh.axis_names)
        every = JP(tuple(mesh.axis_names))
        d = mesh.size

        def probe(name, body, *local_shapes, info=(), fill=(0.5, 0.5)):
            fn = jax.jit(jax.shard_map(body, mesh=jm, in_specs=(every,) * len(local_shapes), out_specs=every,
                                       check_vma=False))
            # filled by NumPy: jnp.full would compile a program per shape (a third of the probes' setup)
            args = tuple(jax.device_put(np.full((d * s[0],) + tuple(s[1:]), v, np.float32),
                                        NamedSharding(jm, every)) for s, v in zip(local_shapes, fill))
            return Probe(name, fn.lower(*args), args, info)  # compiled below, in parallel

        def sustained(step, k):  # k steps: the probe runs for tens of milliseconds, as a program does
            def body(a, *rest):
                for _ in range(k):
                    a = lax.optimization_barrier(step(a, *rest))
                return a
            return body

        def fma16(a):
            for _ in range(16):
                a = a * 0.999 + 0.001
            return a

        def tiny_chain(a):
            for _ in range(TINY):
                a = a @ a
            return a

        def matmuls(b, m, k, n):  # x [m,k] @ y [k,n] -> [m,n], then . y^T -> [m,k]: two products a step
            def step(x, y):
                x3, y3 = x.reshape(b, m, k), y.reshape(b, k, n)
                h = lax.dot_general(x3, y3, (((2,), (1,)), ((0,), (0,))))
                return lax.dot_general(h, y3, (((2,), (2,)), ((0,), (0,)))).reshape(b * m, k) * (k / n)
            return step

        self.probes: list[Probe] = [probe("noop", lambda a: a + 1, (1,))]
        for b, m, k, n in MATMULS:
            steps = max(1, MATMUL_FLOPS // (4 * b * m * k * n))
            self.probes.append(probe("matmul", sustained(matmuls(b, m, k, n), steps), (b * m, k), (b * k, n),
                                     fill=(0.5, 1.0 / k), info=(steps * 4 * b * m * k * n,)))
        for bound, (b, m, k, n), total in MATMUL_CLASSES:
            steps = max(1, total // (4 * b * m * k * n))
            self.probes.append(probe("matmul-class", sustained(matmuls(b, m, k, n), steps), (b * m, k), (b * k, n),
                                     fill=(0.5, 1.0 / k), info=(steps * 4 * b * m * k * n, 2 * steps, bound)))
        dn = ("NHWC", "HWIO", "NHWC")
        conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
        for cls, hw_, c in CONV_PROBES:
            per_image = 2 * hw_ * hw_ * 9 * c * c
            nimg = max(1, round(CONV_FLOPS / per_image))
            self.probes.append(probe("conv", sustained(conv, CONV_SUSTAIN), (nimg, hw_, hw_, c), (3, 3, c, c),
                                     fill=(0.5, 1 / (9 * c)), info=(CONV_SUSTAIN * nimg * per_image, cls)))
        for cls, f, hw_, c in WGRAD_PROBES:
            w0 = jnp.zeros((3, 3, c, c), jnp.float32)
            wgrad = jax.grad(lambda w, x, dy: jnp.vdot(conv(x, w), dy))
            step = lambda x, dy: x * (1.0 + 1e-9 * jnp.mean(wgrad(w0, x, dy)))  # x-shaped: sustained chains it
            self.probes.append(probe("conv", sustained(step, CONV_SUSTAIN), (f, hw_, hw_, c), (f, hw_, hw_, c),
                                     fill=(0.5, 0.5), info=(CONV_SUSTAIN * 2 * f * hw_ * hw_ * 9 * c * c, cls)))
        self.probes.append(probe("tiny", tiny_chain, (16, 16), fill=(1 / 16,), info=(TINY * 2 * 16 ** 3,)))
        self.probes.append(probe("memory", lambda a: a * 0.5 + a[::-1] * 0.25, (MEM_ELEMS,)))
        self.probes.append(probe("reduce", lambda a: jnp.sum(a.reshape(-1, REDUCE_ROW), axis=1), (MEM_ELEMS,)))
        self.probes.append(probe("vector", sustained(fma16, SUSTAIN), (ELEMS,)))
        self.probes.append(probe("tanh", sustained(jnp.tanh, SUSTAIN), (ELEMS,)))
        # collectives above LARGE bytes are made (inputs allocated, compiled) only when a round
        # first needs them, size by size (warm_up bounds them in time)
        self._large: dict[int, list[Callable[[], Probe]]] = {}
        for axis, p in zip(mesh.axis_names, mesh.shape):
            if p == 1:
                continue
            for kind in KINDS:
                for b in sizes:
                    n = max(p, b // 4 // p * p)  # f32 elements per device, divisible by p
                    rep = LARGE_REPEAT if 4 * n > LARGE else REPEAT
                    make = functools.partial(probe, f"{kind}:{axis}", _collective(kind, axis, p, lax, jnp, rep), (n,),
                                             info=(axis, p, kind, 4 * n, rep))
                    if 4 * n > LARGE:
                        self._large.setdefault(4 * n, []).append(make)
                    else:
                        self.probes.append(make())
        _compile(self.probes)

    def _make_large(self, nb: int) -> list[Probe]:
        made = [make() for make in self._large.pop(nb)]
        _compile(made)
        self.probes.extend(made)
        return made

    def sample(self) -> None:
        for nb in sorted(self._large):  # not bounded by a warm-up: measured too
            self._make_large(nb)
        for pr in self.probes:
            pr.run()

    def warm_up(self, large_budget_s: Optional[float] = None) -> tuple[int, ...]:
        """One uncounted round. ``large_budget_s``: the collectives larger than ``LARGE`` are
        made and run size by size (smallest first); a size is kept while the rounds of the
        kept ones stay within the budget, and the first that does not is dropped with every
        larger one (so every later round spends at most ``large_budget_s`` on them, and this
        one about that plus one size's round). A size whose round, predicted from the last
        size's (in proportion to the bytes), would pass the budget is not even made. The
        collective sizes kept, in bytes."""
        ran = {id(pr): pr.run() for pr in self.probes}
        colls = [pr for pr in self.probes if ":" in pr.name]
        last = max((pr.info[3] for pr in colls), default=0)
        spent, t_last = 0.0, sum(ran[id(pr)] for pr in colls if pr.info[3] == last)
        for nb in sorted(self._large):
            # a size's round takes about its bytes' share of the last one's: past the budget, it
            # is not even made (making one allocates and compiles its probes)
            if large_budget_s is not None and last and spent + t_last * nb / last > large_budget_s:
                self._large.clear()
                break
            made = self._make_large(nb)
            t = sum(pr.run() for pr in made)
            if large_budget_s is not None and spent + t > large_budget_s:
                self.probes = [pr for pr in self.probes if all(pr is not m for m in made)]
                self._large.clear()
                break
            spent, last, t_last = spent + t, nb, t
        for pr in self.probes:
            pr.times.clear()
        return tuple(sorted({pr.info[3] for pr in self.probes if pr.name.partition(":")[1]}))

    def fit(self, name: str = "calibrated", round: Optional[int] = None) -> Measured:
        """What the probes' medians say (or one round's times, ``round``): the fields of a
        ``gp.Hardware`` (``Hardware.from_measured``)."""
        at = (lambda pr: pr.median) if round is None else (lambda pr: pr.times[round])
        med = {}
        for pr in self.probes:
            med.setdefault(pr.name, []).append(pr)
        t0 = at(med["noop"][0])
        net = lambda pr: max(at(pr) - t0, 1e-7)
        # the harmonic mean of the shapes' rates (each shape's time per FLOP weighs the same)
        rate = len(med["matmul"]) / sum(net(pr) / pr.info[0] for pr in med["matmul"])
        tiny = med["tiny"][0]
        overhead = max(0.0, (net(tiny) - tiny.info[0] / rate) / TINY)
        # each class's rate net of its kernels' launch overhead (the model adds that per kernel),
        # as a fraction of the peak; smaller classes never faster than larger ones
        eff = lambda pr, kernels: min(MAX_EFFICIENCY, max(0.01, pr.info[0] / max(net(pr) - kernels * overhead, 1e-7)
                                                          / rate))
        mm_classes, cap = [], 1.0
        for pr in sorted(med.get("matmul-class", []), key=lambda pr: -pr.info[2]):
            cap = min(cap, eff(pr, pr.info[1]))
            mm_classes.append((float(pr.info[2]), cap))
        conv_classes = tuple(sorted((pr.info[1], eff(pr, CONV_SUSTAIN)) for pr in med["conv"]))
        conv_eff = dict(conv_classes).get("small-c/large-hw", 1.0)
        bandwidth = 12 * MEM_ELEMS / max(net(med["memory"][0]) - overhead, 1e-7)
        reduce_bw = 4 * MEM_ELEMS * (1 + 1 / REDUCE_ROW) / max(net(med["reduce"][0]) - overhead, 1e-7)
        vector = SUSTAIN * 32 * ELEMS / max(net(med["vector"][0]) - SUSTAIN * overhead, 1e-7)
        trans = max(1.0, (net(med["tanh"][0]) - SUSTAIN * overhead) * vector / (SUSTAIN * ELEMS))
        links = []
        for axis, p in zip(self.mesh.axis_names, self.mesh.shape):
            if p == 1:
                continue
            rows, ts, kinds = [], [], []
            for kind in KINDS:
                for pr in med.get(f"{kind}:{axis}", []):
                    nb = pr.info[3]
                    rows.append((collective_time(kind, nb, [Level(p, Link(1.0, float("inf")))]),
                                 collective_time(kind, nb, [Level(p, Link(0.0, 1.0))])))
                    ts.append(net(pr) / pr.info[4])
                    kinds.append(kind)
            rows_a, ts_a, kinds_a = np.asarray(rows), np.asarray(ts), np.asarray(kinds)
            alpha, inv_beta = fit_alpha_beta(rows_a, ts_a)
            per_kind = []
            for kind in KINDS:
                sel = kinds_a == kind
                if sel.sum() >= 2:
                    a, ib = fit_alpha_beta(rows_a[sel], ts_a[sel])
                    per_kind.append((kind, a, 1.0 / ib))
            links.append((axis, Link(alpha, 1.0 / inv_beta, axis, per_kind=tuple(per_kind))))
        platform = self.mesh.jax_devices().reshape(-1)[0].platform
        mem = _host_memory() / self.mesh.size if platform == "cpu" else float(16 * 2 ** 30)
        return Measured(
            f"{name} ({platform}, {self.mesh.size} devices)", (("float32", rate),), vector_flops=vector,
            mem_bandwidth=bandwidth, mem_capacity=mem,
            topology=PerAxis(tuple(links), links[-1][1] if links else Link(0.0, 1e12)),
            transcendental_flops=trans, conv_efficiency=conv_eff, op_overhead=overhead, step_overhead=t0,
            matmul_classes=tuple(sorted(mm_classes)), conv_classes=conv_classes, reduce_bandwidth=reduce_bw,
        )


def measure(mesh: Mesh, *, sizes: Sequence[int] = SIZES, reps: int = 5, name: str = "calibrated",
            large_budget_s: Optional[float] = LARGE_BUDGET_S) -> Measured:
    """Sample every probe ``reps`` times after one warm-up round; what they measured.
    Collectives larger than ``LARGE`` (2 MiB) per device are time-bounded: the warm-up makes
    and runs them smallest size first, and drops the size whose round would take them past
    ``large_budget_s`` seconds (None: no bound) with every larger one: those are not measured,
    and the cost model extrapolates from the largest one that was. So the large probes add at
    most about ``(reps + 1) * large_budget_s`` (plus one size's round, and compiling it) to a
    calibration."""
    t0 = time.perf_counter()
    log.info("calibrating %s: compiling the probes (matmuls, convs, memory, collectives on every axis)", mesh)
    cal = Calibrator(mesh, sizes)
    kept = cal.warm_up(large_budget_s)  # warm-up round, not counted
    log.info("calibrating %s: warmed up in %.1f s (collectives up to %d KiB per device); %d rounds to measure",
             mesh, time.perf_counter() - t0, max(kept, default=0) // 1024, reps)
    for i in range(reps):
        cal.sample()
        log.info("calibrating %s: round %d of %d measured (%.1f s)", mesh, i + 1, reps, time.perf_counter() - t0)
    measured = cal.fit(name)
    log.info("calibrated %s in %.1f s", mesh, time.perf_counter() - t0)
    return measured


def _compile(probes: Sequence[Probe]) -> None:
    """Compile the probes' lowered programs, in parallel (XLA compiles without the GIL)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for pr, exe in zip(probes, pool.map(lambda pr: pr.fn.compile(), probes)):
            pr.fn = exe


def _host_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return float(16 * 2 ** 30)


def _collective(kind: str, axis: str, p: int, lax, jnp, repeat: int = REPEAT) -> Callable:
    """``repeat`` dependent collectives of ``kind`` (the program's launch is paid once)."""
    if kind == ALL_GATHER:
        one = lambda a: lax.all_gather(a, axis, tiled=True)[: a.shape[0]]
    elif kind == REDUCE_SCATTER:
        one = lambda a: jnp.tile(lax.psum_scatter(a, axis, tiled=True), p)
    elif kind == ALL_REDUCE:
        one = lambda a: lax.psum(a, axis)
    elif kind == ALL_TO_ALL:
        one = lambda a: lax.all_to_all(a, axis, 0, 0, tiled=True)
    else:
        one = lambda a: lax.ppermute(a, axis, [(i, (i + 1) % p) for i in range(p)])

    def body(a):
        for _ in range(repeat):
            a = one(a)
        return a

    return body


def fit_alpha_beta(rows: np.ndarray, ts: np.ndarray) -> tuple[float, float]:
    """Non-negative least squares of ``ts ~ rows @ (alpha, 1/beta)``, relative error."""
    w = 1.0 / np.maximum(ts, 1e-12)
    a, b = rows * w[:, None], ts * w
    best: Optional[tuple[float, np.ndarray]] = None
    for cols in ((0, 1), (0,), (1,)):
        sol = np.zeros(2)
        x, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if np.any(x < 0):
            continue
        sol[list(cols)] = x
        err = float(np.sum((a @ sol - b) ** 2))
        if best is None or err < best[0]:
            best = (err, sol)
    sol = best[1] if best else np.array([0.0, 1e-9])
    return float(sol[0]), float(max(sol[1], 1e-15))
