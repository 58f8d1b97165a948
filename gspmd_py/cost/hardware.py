"""``gp.Hardware``: what one device computes and moves per second, and the links between devices.

A Hardware is a value: peak matmul FLOP/s per dtype, a vector (non-matmul) rate, memory
bandwidth and capacity per device, the fractions of the peak that matmuls and convs of each
shape class reach (rates.py), and a *topology* that turns any group of devices a
collective runs over into link levels, each ``(p, Link)``: ``p`` devices of the group
communicate over ``link`` (latency ``alpha`` s per message step, bandwidth ``beta`` bytes/s
that each device moves). Collectives are priced over those levels (collectives.py).

How a preset maps mesh axes to links: by the device ids of the mesh (``gp.Mesh`` ids; an
abstract mesh is numbered 0..n-1 row-major). For a collective over some mesh axes, the
devices that share the other coordinates form its group; the group's ids decide the links:

* ``"a100-node"`` / ``"h100-node"``: 8 GPUs per node on NVSwitch (device id // 8 is the
  node). A group inside one node uses NVLink; a group with one device per node uses the
  network; a group spanning ``p_out`` nodes with ``p_in`` devices in each is hierarchical
  (NVLink level of p_in, then network level of p_out)::

      >>> hw = Hardware.preset("h100-node")
      >>> mesh = Mesh.abstract((16, 8), ("data", "model"))
      >>> [(lv.p, lv.link.name) for lv in hw.levels(mesh, ("model",))]
      [(8, 'nvlink')]
      >>> [(lv.p, lv.link.name) for lv in hw.levels(mesh, ("data",))]
      [(16, 'network')]
      >>> [(lv.p, lv.link.name) for lv in hw.levels(Mesh.abstract((8, 16), ("a", "b")), ("b",))]
      [(8, 'nvlink'), (2, 'network')]

* ``"tpu-v3"`` (one device = one core; 2 cores per chip) / ``"tpu-v4"`` (one device = one
  chip): chips (id // cores_per_chip) fill a 2D (v3) or 3D (v4) torus in id order, x
  fastest; the torus shape is the most nearly square (cubic) one for the chip count
  (64 chips: 8x8; 1024: 32x32). A group's cores on one chip form an on-chip level; its
  chips form one ring level per torus dimension they span (bidirectional rings: each
  device moves 2 links' worth, shared by the cores of a chip).
* ``Hardware.calibrate(mesh)``: one measured link per mesh axis (``PerAxis``).

Levels are ordered fastest first. How ONE collective over a multi-level group runs is the
runtime's choice, and the Hardware says which it assumes (``algorithm``):

* ``"ring"`` (the GPU presets): NCCL's ring over all the group's devices, paced by its
  slowest link (``(p-1) alpha_slow + (p-1)/p n / beta_slow`` per ring pass). A partitioner
  that wants the phased program emits it as separate collectives over sub-groups
  (``gp.spmd(..., hardware=hw)``: partitioner/hierarchy.py), each priced on its own level.
* ``"hierarchical"`` (the TPU presets, calibrated hardware): the runtime runs phases
  itself, one per level (reduce-scatter on the fastest level first, so the slow levels
  carry the least data), as TPU collectives do over the dimensions of the torus.

``Hardware.preset("h100-node", node_size=4)`` changes a switched preset's devices per node
(8 CPU devices then stand for 2 nodes of 4)::

    >>> hw = Hardware.preset("h100-node", node_size=4)
    >>> [(lv.p, lv.link.name) for lv in hw.levels(Mesh.abstract((2, 4), ("node", "gpu")), ("node", "gpu"))]
    [(4, 'nvlink'), (2, 'network')]
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import attrs
import numpy as np

from ..core.errors import HardwareError, ShardingError
from ..core.mesh import Mesh
from .calibrate import LARGE_BUDGET_S, SIZES, Measured, measure
from .collectives import collective_time
from .topology import Level, Link, PerAxis, Switched, Topology, Torus

GiB = 2 ** 30


@attrs.frozen
class Hardware:
    """A device and its links (see the module docstring for how mesh axes map to links).

    Build one with ``Hardware.preset(name)`` or ``Hardware.calibrate(mesh)``. Fields:
    ``name``; ``matmul_flops`` ((dtype name, FLOP/s) pairs for dot_general / conv);
    ``vector_flops`` (FLOP/s of everything else); ``transcendental_flops`` (FLOPs charged per
    exp/log/tanh element); ``mem_bandwidth`` (bytes/s); ``mem_capacity`` (bytes per device);
    ``topology`` (the link levels); ``conv_efficiency``; ``op_overhead`` and ``step_overhead``
    (seconds per kernel, per program run); ``algorithm`` ("hierarchical" or "ring": a
    collective spanning link levels); ``matmul_classes``, ``conv_classes``, ``reduce_bandwidth``
    (per-shape-class rates a calibration measured).

    >>> hw = Hardware.preset("tpu-v3")
    >>> hw.peak("bfloat16") / 1e12, hw.mem_capacity / 2**30
    (61.5, 16.0)
    """

    name: str
    matmul_flops: tuple[tuple[str, float], ...]  # (dtype name, FLOP/s) for dot_general / conv
    vector_flops: float  # FLOP/s of everything else (elementwise, reductions)
    mem_bandwidth: float  # bytes/s
    mem_capacity: float  # bytes per device
    topology: Topology
    transcendental_flops: float = 1.0  # FLOPs charged per exp/log/tanh/... element
    conv_efficiency: float = 1.0  # fraction of the matmul rate that convolutions reach (classes not listed below)
    op_overhead: float = 0.0  # seconds per kernel launched (each materialized result)
    step_overhead: float = 0.0  # seconds per program execution (launching it on every device)
    # one collective over a group spanning link levels: "ring" (paced by the slowest link, as
    # NCCL's ring) or "hierarchical" (the runtime runs one phase per level); module docstring
    algorithm: str = attrs.field(default="hierarchical", validator=attrs.validators.in_(("ring", "hierarchical")))
    # per-shape-class rates (rates.py): ((max FLOPs per op, fraction of the peak), ...) ascending for
    # dot_general; ((conv class, fraction of the peak), ...) for convs; bytes/s of reductions (0: mem_bandwidth)
    matmul_classes: tuple[tuple[float, float], ...] = ()
    conv_classes: tuple[tuple[str, float], ...] = ()
    reduce_bandwidth: float = 0.0

    # -- rates -----------------------------------------------------------------------
    def peak(self, dtype) -> float:
        """Matmul FLOP/s for operands of ``dtype`` (float32's rate for unlisted dtypes)."""
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        rates = dict(self.matmul_flops)
        if name in rates:
            return rates[name]
        return rates.get("float32", max(rates.values()))

    # -- links -----------------------------------------------------------------------
    def levels(self, mesh: Mesh, axes: Sequence) -> list[Level]:
        """The link levels of a collective over ``axes`` of ``mesh`` (fastest first)."""
        axes = tuple(str(a) for a in axes)
        if not axes:
            return []
        topo = self.topology
        if isinstance(topo, PerAxis):
            out = [Level(mesh.ref(a).size, topo.link(mesh.ref(a).name)) for a in axes]
        else:
            out = topo.levels_of(group_ids(mesh, axes), mesh.size)
        return sorted((lv for lv in out if lv.p > 1), key=lambda lv: -lv.link.beta)

    def collective_time(self, kind: str, bytes_per_device: int, mesh: Mesh, axes: Sequence) -> float:
        """Seconds of one collective over ``axes`` of ``mesh`` (sub-axes allowed) as this hardware
        runs it: its levels, under the ``algorithm`` it assumes for a multi-level group."""
        return collective_time(kind, bytes_per_device, self.levels(mesh, axes), self.algorithm)

    def is_flat(self, mesh: Mesh, axes: Sequence) -> bool:
        """True when a collective over ``axes`` stays on one link level (nothing to decompose)."""
        return len(self.levels(mesh, axes)) <= 1

    # -- construction ----------------------------------------------------------------
    @staticmethod
    def preset(name: str, node_size: Optional[int] = None) -> "Hardware":
        """One of ``PRESETS``: "tpu-v3", "tpu-v4", "a100-node", "h100-node".

        ``node_size``: devices per node of a switched preset (GPU nodes; default 8), so a
        test's 8 CPU devices can stand for 2 nodes of 4."""
        try:
            hw = PRESETS[name]
        except KeyError:
            raise ShardingError(f"unknown hardware preset {name!r}; presets: {sorted(PRESETS)}") from None
        if node_size is None:
            return hw
        if not isinstance(node_size, int) or isinstance(node_size, bool) or node_size < 1:
            raise HardwareError(f"Hardware.preset({name!r}, node_size={node_size!r}): node_size must be a "
                                f"positive int (devices per node)")
        if not isinstance(hw.topology, Switched) or hw.topology.node_size is None:
            raise HardwareError(f"Hardware.preset({name!r}, node_size={node_size}): only switched presets have "
                                f"nodes ({sorted(k for k, v in PRESETS.items() if isinstance(v.topology, Switched))}); "
                                f"{name!r} is a {type(hw.topology).__name__.lower()}")
        return attrs.evolve(hw, name=f"{name}/{node_size}", topology=attrs.evolve(hw.topology, node_size=node_size))

    @staticmethod
    def calibrate(mesh: Mesh, *, sizes: Sequence[int] = SIZES, reps: int = 5, name: str = "calibrated",
                  large_budget_s: Optional[float] = LARGE_BUDGET_S) -> "Hardware":
        """Measure this machine over ``mesh`` (see calibrate.py): matmul and vector rates,
        memory bandwidth, and per mesh axis alpha and beta fitted by least squares.
        Collectives are measured at ``sizes`` bytes per device (default 16 KiB to 32 MiB);
        those above 2 MiB within ``large_budget_s`` seconds per round (1.5 s: on a slow
        host the largest sizes are dropped and extrapolated; None: measure them all)."""
        import jax

        if isinstance(mesh, jax.sharding.Mesh):
            mesh = Mesh.from_jax(mesh)
        if not isinstance(mesh, Mesh):
            raise HardwareError(f"gp.Hardware.calibrate needs the gp.Mesh to measure, got {type(mesh).__name__} "
                                f"{mesh!r:.40}")
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise HardwareError(f"gp.Hardware.calibrate: reps must be a positive int (rounds measured), got {reps!r}")
        return Hardware.from_measured(measure(mesh, sizes=sizes, reps=reps, name=name,
                                              large_budget_s=large_budget_s))

    @staticmethod
    def from_measured(m: Measured) -> "Hardware":
        """The Hardware a calibration measured (calibrate.py's ``Measured``)."""
        return Hardware(**attrs.asdict(m, recurse=False))


def group_ids(mesh: Mesh, axes: Sequence[str]) -> np.ndarray:
    """Device ids of the first group of a collective over ``axes`` (sub-axes allowed), in
    group order: the devices whose coordinates on every other (sub-)axis are device 0's
    (the fine mesh's device groups over the mesh with the axes split where the sub-axes need)."""
    from ..core.fine_mesh import FineMesh, device_groups

    refs = [mesh.ref(a) for a in axes]
    fine = FineMesh.build(mesh, refs)
    idx = [fine.names.index(n) for r in refs for n in fine.fine(r)]
    return mesh.device_ids.reshape(-1)[device_groups(fine.sizes, idx)[0]]


# -- presets -------------------------------------------------------------------------------
# Per-shape-class rates (rates.py) of the presets, as fractions of the peak. Estimates, from:
# TPUs: the MXU is a 128 x 128 systolic array and operands are tiled to 128 (Cloud TPU
# performance guide, "tensor dimensions": dims not a multiple of 128 are padded), so a conv with
# fewer than 32 channels fills at most 32/128 of it (0.2), a 64^3 matmul at most (64/128)^2
# (0.25), one of 128 x 128 x 256 half of a pipelined pass (0.6); large convs reach about 80%
# (ResNet-50 on TPU v3 in Kumar et al., "Scale MLPerf-0.6 models on Google TPU-v3 Pods", 2019).
# GPUs: a GEMM uses one thread block per 128 x 128 output tile (NVIDIA "Matrix Multiplication
# Background User's Guide": tile quantization and wave quantization), so a 64^3 product keeps 1
# of 108-132 SMs busy (0.05 is generous) and 128 x 128 x 256 a few (0.25); cuDNN convs with few
# channels cannot fill the tensor cores (NVIDIA "Convolutional Layers User's Guide": channels
# multiples of 8, throughput rising with C and K): 0.2-0.25, many channels 0.55-0.7 (MLPerf
# ResNet-50 runs at about 60-70% of the tensor-core peak). Reductions stream at the memory bandwidth.
_TPU_MATMULS = ((2.0 ** 20, 0.25), (2.0 ** 23, 0.6))
_TPU_CONVS = (("large-c/large-hw", 0.8), ("large-c/small-hw", 0.7), ("small-c/large-hw", 0.2),
              ("small-c/small-hw", 0.2))
_GPU_MATMULS = ((2.0 ** 20, 0.05), (2.0 ** 23, 0.25))
_GPU_CONVS = (("large-c/large-hw", 0.7), ("large-c/small-hw", 0.55), ("small-c/large-hw", 0.25),
              ("small-c/small-hw", 0.2))

# TPU v3, one TensorCore per device. Cloud TPU docs "TPU v3" (cloud.google.com/tpu/docs/v3):
# 123 TFLOP/s bf16 and 32 GiB HBM at 900 GB/s per chip of 2 cores -> 61.5 TFLOP/s, 16 GiB,
# 450 GB/s per core; 2D torus, 1024 chips, "all-reduce bandwidth per pod 340 TB/s" = 4 ICI
# links x ~83 GB/s per chip (Jouppi et al., "A Domain-Specific Supercomputer for Training
# Deep Neural Networks", CACM 2020: 656 Gbit/s per ICI link). JAX's default precision runs
# f32 matmuls as one bf16 pass on the MXU. Vector unit, latencies: estimates (ours).
_TPU_V3 = Hardware(
    "tpu-v3", (("bfloat16", 61.5e12), ("float32", 61.5e12), ("float16", 61.5e12)), vector_flops=3.9e12,
    mem_bandwidth=450e9, mem_capacity=16 * GiB,
    topology=Torus(2, Link(2e-6, 82e9, "ici"), cores_per_chip=2, on_chip=Link(1e-6, 450e9, "on-chip")),
    matmul_classes=_TPU_MATMULS, conv_classes=_TPU_CONVS,
)
# TPU v4, one chip (2 TensorCores as one device). Cloud TPU docs "TPU v4": 275 TFLOP/s
# bf16, 32 GiB HBM2 at 1200 GB/s, 3D torus of 4096 chips, "all-reduce bandwidth per pod
# 1.1 PB/s" = 6 ICI links x ~45 GB/s per chip (Jouppi et al., ISCA 2023).
_TPU_V4 = Hardware(
    "tpu-v4", (("bfloat16", 275e12), ("float32", 275e12), ("float16", 275e12)), vector_flops=8.6e12,
    mem_bandwidth=1200e9, mem_capacity=32 * GiB, topology=Torus(3, Link(2e-6, 45e9, "ici")),
    matmul_classes=_TPU_MATMULS, conv_classes=_TPU_CONVS,
)
# DGX A100 (NVIDIA A100 Tensor Core GPU datasheet; DGX A100 user guide): A100 SXM4 80GB,
# 312 TFLOP/s bf16/f16 dense, 156 TF32 (XLA's default for f32 dots on A100), 19.5 TFLOP/s
# f32 vector, HBM2e 2,039 GB/s; NVLink3 600 GB/s per GPU both directions (300 GB/s each
# way) through NVSwitch; one 200 Gb/s HDR InfiniBand NIC per GPU (25 GB/s). Latencies:
# typical NCCL per-step figures (estimates).
_A100 = Hardware(
    "a100-node", (("bfloat16", 312e12), ("float16", 312e12), ("float32", 156e12), ("float64", 19.5e12)),
    vector_flops=19.5e12, mem_bandwidth=2039e9, mem_capacity=80 * GiB,
    topology=Switched(Link(3e-6, 300e9, "nvlink"), Link(8e-6, 25e9, "network"), node_size=8),
    op_overhead=3e-6, algorithm="ring", matmul_classes=_GPU_MATMULS, conv_classes=_GPU_CONVS,
)
# DGX H100 (NVIDIA H100 Tensor Core GPU datasheet; DGX H100 user guide): H100 SXM5 80GB,
# 989 TFLOP/s bf16/f16 dense, 494 TF32, 67 TFLOP/s f32 vector, HBM3 3.35 TB/s; NVLink4
# 900 GB/s per GPU (450 GB/s each way) through NVSwitch; one 400 Gb/s NDR ConnectX-7 NIC
# per GPU (50 GB/s).
_H100 = Hardware(
    "h100-node", (("bfloat16", 989e12), ("float16", 989e12), ("float32", 494e12), ("float64", 67e12)),
    vector_flops=67e12, mem_bandwidth=3.35e12, mem_capacity=80 * GiB,
    topology=Switched(Link(3e-6, 450e9, "nvlink"), Link(8e-6, 50e9, "network"), node_size=8),
    op_overhead=3e-6, algorithm="ring", matmul_classes=_GPU_MATMULS, conv_classes=_GPU_CONVS,
)

PRESETS: Mapping[str, Hardware] = {"tpu-v3": _TPU_V3, "tpu-v4": _TPU_V4, "a100-node": _A100, "h100-node": _H100}
