"""``plan.cost(hw)``: a prediction of one step of the SPMD program on ``hw``, per device.

The model reads one typed value, a ``CostInput`` (the program index, the mesh, the donated
inputs; ``plan.cost_input()`` makes a plan's, the search builds one per candidate), never
JAX's execution:

* ``index``: the per-device program (local shapes) as the program index read it
  (program/program_index.py); the walk goes over its bodies, never over the program
  itself. Each equation's FLOPs and bytes (counting.py, fusion.py); its op, its
  collectives and its loops' trip counts are the index's (``scan``: ``length``; ``while``:
  derived when the loop counts a constant range — ``i = c0; while i < c1: i += s`` — else
  ``while_trips``, said in ``notes``); loop bodies count times their trip count, ``cond``:
  its costliest branch.
* the index's collectives: every collective (kind, axes, bytes), priced over the links that
  ``hw`` gives its axes (collectives.py), as the runtime runs it (``hw.algorithm``: one
  flat all-reduce over NVLink and the network is one ring paced by the network; the phased
  program is priced as phases only when the plan holds its phases as collectives). A
  combined collective is one record: one alpha.

Time per equation: ``max(flops / rate, bytes / mem_bandwidth)`` (rates.py: the rate of its
shape class: a matmul's by its FLOPs, a conv's by its channels and image size; reductions at
``reduce_bandwidth``) (+ ``op_overhead`` per
kernel, ``step_overhead`` per step); ``step_serial_s`` = compute + communication; ``step_overlap_s`` = a schedule of
the program on two streams (compute, collectives) in program order, each equation starting
when its operands are ready. ``step_s`` is the serial time unless ``overlap=True``.

Memory: a liveness walk over the buffers of the program index's bodies (memory.py).

    >>> import jax, jax.numpy as jnp, gspmd_py as gp
    >>> mesh = gp.Mesh.abstract((4,), ("m",))
    >>> f = gp.spmd(lambda x, w1, w2: (x @ w1) @ w2, mesh, in_shardings=(None, gp.P(None, "m"), gp.P("m", None)))
    >>> S = jax.ShapeDtypeStruct
    >>> c = f.plan(S((8, 16), jnp.float32), S((16, 32), jnp.float32), S((32, 16), jnp.float32)).cost(
    ...     gp.Hardware.preset("h100-node"))
    >>> c.flops, c.comm_bytes          # (2*8*16*32 + 2*8*32*16) / 4; one all-reduce of f32[8,16]
    (4096, 512)
"""
from __future__ import annotations

import re

import attrs
import numpy as np
from jax.extend.core import Literal

from ..core.errors import HardwareError
from ..core.mesh import Mesh
from ..ops import facts as F
from ..ops import facts_of
from ..program.collective import Collective
from ..program.program_index import Body, EqnIndex, ProgramIndex
from .collectives import sent_bytes
from .counting import eqn_flops, is_free
from .fusion import Fusion, fusion_of
from .hardware import Hardware
from .memory import Memory, peak_memory
from .rates import compute_seconds, conv_class


def _flat_indices(donate) -> tuple[int, ...]:
    if isinstance(donate, (int, np.integer)):
        donate = (donate,)
    return tuple(int(i) for i in donate)


@attrs.frozen
class CostInput:
    """What the cost model prices: the per-device program as the program index read it, the
    mesh its collectives run over, and the flat input indices whose buffers it may reuse."""

    index: ProgramIndex
    mesh: Mesh
    donate: tuple[int, ...] = attrs.field(default=(), converter=_flat_indices)


@attrs.frozen
class CollectiveCost:
    """One collective of the program: its record (``collective``, a gp.Collective), how often it
    runs per step (``count``), and the predicted ``seconds`` of one execution."""

    collective: Collective
    count: int  # executions per step (trip counts of enclosing loops)
    seconds: float  # one execution

    def __str__(self) -> str:
        c = self.collective
        times = f" x{self.count}" if self.count != 1 else ""
        return f"{c.kind}({','.join(c.axes)}) {_size(c.bytes_per_device)}{times} {_dur(self.seconds * self.count)}"


@attrs.frozen
class OpCost:
    """The per-step totals of one IR op (or the boundary, or one combined collective): ``key``
    ("op12", "combined:3,7", "boundary"), ``label`` (as reports name the op), ``flops``,
    ``transcendentals``, ``bytes_accessed``, ``compute_s`` and its ``collectives``."""

    key: str  # "op12", "combined:3,7", "boundary"
    label: str
    flops: float
    transcendentals: float
    bytes_accessed: float
    compute_s: float
    collectives: tuple[CollectiveCost, ...]

    @property
    def comm_s(self) -> float:
        """Predicted seconds of the op's collectives per step."""
        return sum(c.seconds * c.count for c in self.collectives)

    @property
    def total_s(self) -> float:
        """``compute_s + comm_s``."""
        return self.compute_s + self.comm_s


@attrs.frozen
class Cost:
    """Predicted cost of one step of a plan on one Hardware, per device.

    ``flops``, ``transcendentals``, ``bytes_accessed`` (memory traffic under fusion),
    ``comm_bytes`` (sum of the collectives' ``bytes_per_device``, times their trip counts),
    ``sent_bytes`` (what each device puts on links under the ring algorithms),
    ``compute_s``, ``comm_s``, ``step_serial_s``, ``step_overlap_s``, ``step_s``,
    ``peak_memory_bytes`` (with ``argument_bytes``, ``output_bytes``), ``fits``;
    ``hardware`` and ``mesh`` name what it was costed on, ``devices`` its device count,
    ``memory_capacity`` the bytes per device, ``ops`` the per-op costs (``table()`` prints the
    largest), ``notes`` what the model assumed.
    """

    hardware: str
    mesh: str
    devices: int
    flops: float
    transcendentals: float
    bytes_accessed: float
    comm_bytes: float
    sent_bytes: float
    compute_s: float
    comm_s: float
    step_serial_s: float
    step_overlap_s: float
    step_s: float
    peak_memory_bytes: int
    argument_bytes: int
    output_bytes: int
    memory_capacity: float
    ops: tuple[OpCost, ...]
    notes: tuple[str, ...] = ()

    @property
    def fits(self) -> bool:
        """Whether the predicted peak memory fits in the hardware's memory per device."""
        return self.peak_memory_bytes <= self.memory_capacity

    @property
    def comm_bytes_by_kind(self) -> dict[str, float]:
        """Communicated bytes per device by collective kind (``all-gather``, ...), trip counts included."""
        out: dict[str, float] = {}
        for op in self.ops:
            for c in op.collectives:
                out[c.collective.kind] = out.get(c.collective.kind, 0) + c.collective.bytes_per_device * c.count
        return dict(sorted(out.items()))

    @property
    def collectives(self) -> tuple[CollectiveCost, ...]:
        """Every costed collective (the gp.Collective, its count and predicted time), in program order."""
        return tuple(c for op in self.ops for c in op.collectives)

    def table(self, top: int = 12) -> str:
        """The ops with the largest predicted time, each with its collectives."""
        rows = sorted(self.ops, key=lambda o: (-o.total_s, o.key))[:top]
        lines = [f"cost on {self.hardware}, {self.mesh} ({self.devices} devices), per device:",
                 f"  step {_dur(self.step_s)} (serial {_dur(self.step_serial_s)}, overlapped "
                 f"{_dur(self.step_overlap_s)}): compute {_dur(self.compute_s)}, communication {_dur(self.comm_s)}",
                 f"  {self.flops:.4g} FLOPs, {_size(self.bytes_accessed)} memory traffic, "
                 f"{_size(self.comm_bytes)} in collectives "
                 + (", ".join(f"{k} {_size(v)}" for k, v in self.comm_bytes_by_kind.items()) or ""),
                 f"  peak memory {_size(self.peak_memory_bytes)} of {_size(self.memory_capacity)}"
                 f" (arguments {_size(self.argument_bytes)}, outputs {_size(self.output_bytes)})"
                 + ("" if self.fits else "  DOES NOT FIT")]
        total = max(self.step_serial_s, 1e-30)
        hdr = ("op", "time", "share", "compute", "FLOPs", "bytes", "collectives")
        body = [(o.label[:60], _dur(o.total_s), f"{100 * o.total_s / total:.1f}%", _dur(o.compute_s),
                 f"{o.flops:.3g}", _size(o.bytes_accessed), "; ".join(str(c) for c in o.collectives))
                for o in rows]
        widths = [max(len(r[i]) for r in [hdr] + body) for i in range(6)]
        for r in [hdr] + body:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r[:6], widths)) + "  " + r[6])
        if len(self.ops) > top:
            lines.append(f"  ... {len(self.ops) - top} more ops")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table(top=5)


# -- the walk ---------------------------------------------------------------------------------

@attrs.define
class _Row:
    label: str
    flops: int = 0
    trans: int = 0
    bytes: int = 0
    compute_s: float = 0.0
    colls: list = attrs.Factory(list)


@attrs.define
class _Acc:
    rows: dict = attrs.Factory(dict)

    def row(self, key: str, label: str) -> _Row:
        r = self.rows.get(key)
        if r is None:
            r = self.rows[key] = _Row(label)
        return r

    def add(self, other: "_Acc") -> None:
        for k, r in other.rows.items():
            mine = self.row(k, r.label)
            mine.flops += r.flops
            mine.trans += r.trans
            mine.bytes += r.bytes
            mine.compute_s += r.compute_s
            mine.colls += r.colls

    @property
    def seconds(self) -> float:
        return sum(r.compute_s + sum(c.seconds * c.count for c in r.colls) for r in self.rows.values())


class _Walker:
    def __init__(self, program: CostInput, hw: Hardware, while_trips: int):
        self.mesh, self.hw, self.while_trips = program.mesh, hw, while_trips
        self.notes: list[str] = []
        self.index: ProgramIndex = program.index  # per equation (by path): its op, collectives, loop counts
        self._levels: dict = {}
        self.fusions: dict = {}  # fusion_of's cache, shared with peak_memory

    def coll_time(self, c: Collective) -> float:
        key = (c.kind, c.axes, c.bytes_per_device)
        t = self._levels.get(key)
        if t is None:
            t = self._levels[key] = self.hw.collective_time(c.kind, c.bytes_per_device, self.mesh, c.axes)
        return t

    def eqn_time(self, eqn, fusion: Fusion) -> tuple[float, float, float, float]:
        """(seconds, flops, transcendentals, bytes) of one plain equation."""
        hw = self.hw
        flops, trans = eqn_flops(eqn)
        nb = fusion.read_bytes(eqn) + fusion.write_bytes(eqn)
        name = eqn.primitive.name
        conv = None
        if facts_of(name).flops == F.CONV_FLOPS:
            conv = conv_class(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape, eqn.params.get("dimension_numbers"),
                              eqn.params.get("rhs_dilation"))
        dtype = eqn.invars[0].aval.dtype if eqn.invars else None
        t = compute_seconds(hw, name, flops, trans, nb, dtype, conv) + hw.op_overhead * fusion.launches(eqn)
        return t, flops, trans, nb

    def walk(self, body: Body, trips: int, acc: _Acc) -> tuple[float, float]:
        """Adds one execution of ``body`` (a body of the program index) x ``trips`` to ``acc``;
        returns (serial, overlapped) seconds of one execution."""
        fusion = fusion_of(body, self.fusions)
        ready: dict = {}
        tc = tm = 0.0
        serial = 0.0
        for entry in body.entries:
            eqn = entry.eqn
            key, label = entry.key, entry.label
            r = max((ready.get(v, 0.0) for v in eqn.invars if not isinstance(v, Literal)), default=0.0)
            subs = self.index.subs(entry)
            if entry.collectives:
                (rec,) = entry.collectives
                t = self.coll_time(rec)
                acc.row(key, label).colls.append(CollectiveCost(rec, trips, t))
                start = max(tm, r)
                tm = end = start + t
                serial += t
            elif is_free(eqn):  # same buffer, nothing runs
                end = r
            elif subs:
                t_ser, t_ovl = self.region(entry, subs, trips, acc)
                start = max(tc, tm, r)
                tc = tm = end = start + t_ovl
                serial += t_ser
            else:
                t, fl, tr, nb = self.eqn_time(eqn, fusion)
                row = acc.row(key, label)
                row.flops += int(fl) * trips
                row.trans += int(tr) * trips
                row.bytes += int(nb) * trips
                row.compute_s += t * trips
                start = max(tc, r)
                tc = end = start + t
                serial += t
            for v in eqn.outvars:
                ready[v] = end
        makespan = max([tc, tm] + [ready.get(v, 0.0) for v in body.jaxpr.outvars if not isinstance(v, Literal)])
        return serial, makespan

    def region(self, entry: EqnIndex, subs: tuple[Body, ...], trips: int, acc: _Acc) -> tuple[float, float]:
        name = entry.prim
        label = entry.label
        if name == "scan":
            n = entry.trip_count
            s, o = self.walk(subs[0], trips * n, acc)
            return s * n, o * n
        if name == "while":
            n = entry.trip_count
            if n is None:
                n = self.while_trips
                self.notes.append(f"while loop in {label}: trip count not derivable, assumed {n} "
                                  f"(plan.cost(..., while_trips=N))")
            total_s = total_o = 0.0
            for b in subs:
                k = n + b.loop.extra  # the condition runs once more than the body
                s, o = self.walk(b, trips * k, acc)
                total_s, total_o = total_s + s * k, total_o + o * k
            return total_s, total_o
        if name == "cond":
            best = None
            for b in subs:  # every branch is walked; the costliest counts
                a = _Acc()
                s, o = self.walk(b, trips, a)
                if best is None or a.seconds > best[0].seconds:
                    best = (a, s, o)
            acc.add(best[0])
            if len(subs) > 1:
                self.notes.append(f"cond in {label}: costed as its costliest of {len(subs)} branches")
            return best[1], best[2]
        # calls (jit, custom_jvp/vjp, remat, ...): inline, once
        call = facts_of(name).region == F.CALL
        s_tot = o_tot = 0.0
        for b in subs:
            if not call and b is not subs[0]:
                continue
            s, o = self.walk(b, trips, acc)
            s_tot, o_tot = s_tot + s, o_tot + o
            if call and name.startswith("custom"):
                break  # the primal body only (the jvp/fwd rules are not run)
        return s_tot, o_tot


# -- entry point -----------------------------------------------------------------------------

def cost(program: CostInput, hw: Hardware, *, donate=None, overlap: bool = False, while_trips: int = 1) -> Cost:
    """Predict one step of ``program`` on ``hw`` (see the module docstring).

    ``donate``: flat input indices whose buffers the program may reuse (as
    ``donate_argnums`` of ``gp.spmd``, flattened); default: ``program.donate``.
    """
    if not isinstance(program, CostInput):
        raise TypeError(f"cost needs a CostInput (plan.cost_input()), got {type(program).__name__}")
    if not isinstance(hw, Hardware):
        hint = f"gp.Hardware.preset({hw!r})" if isinstance(hw, str) else "gp.Hardware.preset('h100-node')"
        raise HardwareError(f"plan.cost needs a gp.Hardware (e.g. {hint}), got {type(hw).__name__}")
    donated = _donated_mask(program.index, program.donate if donate is None else _flat_indices(donate))
    w = _Walker(program, hw, while_trips)
    acc = _Acc()
    serial, overlapped = w.walk(program.index.root, 1, acc)
    serial, overlapped = serial + hw.step_overhead, overlapped + hw.step_overhead
    mem: Memory = peak_memory(program.index, donated, w.fusions)
    ops = []
    for key, r in acc.rows.items():
        ops.append(OpCost(key, r.label, r.flops, r.trans, r.bytes, r.compute_s, tuple(r.colls)))
    ops.sort(key=_op_order)
    compute = sum(o.compute_s for o in ops)
    comm = sum(o.comm_s for o in ops)
    colls = [c for o in ops for c in o.collectives]
    notes = list(dict.fromkeys(w.notes))
    return Cost(
        hardware=hw.name, mesh=repr(program.mesh), devices=program.mesh.size,
        flops=sum(o.flops for o in ops), transcendentals=sum(o.transcendentals for o in ops),
        bytes_accessed=sum(o.bytes_accessed for o in ops),
        comm_bytes=sum(c.collective.bytes_per_device * c.count for c in colls),
        sent_bytes=sum(sent_bytes(c.collective.kind, c.collective.bytes_per_device, c.collective.group_size)
                       * c.count for c in colls),
        compute_s=compute, comm_s=comm, step_serial_s=serial, step_overlap_s=overlapped,
        step_s=overlapped if overlap else serial,
        peak_memory_bytes=mem.peak, argument_bytes=mem.arguments, output_bytes=mem.outputs,
        memory_capacity=hw.mem_capacity, ops=tuple(ops), notes=tuple(notes),
    )


def _op_order(o: OpCost):
    m = re.match(r"op(\d+)$", o.key)
    return (0, int(m.group(1)), "") if m else (1, 0, o.key)


def _donated_mask(index: ProgramIndex, donate: tuple[int, ...]) -> tuple[bool, ...]:
    n = len(index.root.jaxpr.invars)
    mask = [False] * n
    for i in donate:
        if not -n <= i < n:
            raise IndexError(f"donate index {i} out of range: the plan has {n} flat inputs")
        mask[i] = True
    return tuple(mask)


def _size(b: float) -> str:
    for unit, k in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(b) >= k:
            return f"{b / k:.3g} {unit}"
    return f"{b:.0f} B"


def _dur(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
