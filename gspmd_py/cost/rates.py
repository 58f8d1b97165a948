"""Compute rates per shape class: the seconds one op's FLOPs and bytes take on a ``gp.Hardware``.

One matmul rate and one conv efficiency mislead where the decision changes a kernel's shape
class: splitting a matmul makes it smaller (a CPU's GEMM on 64 x 64 tiles runs far below its
rate on 512 x 512 ones), tiling a conv over H x W shrinks each device's image, and a conv
with few channels cannot fill a matrix unit (TPU lanes are 128 wide). So a Hardware carries,
besides its peak rates (all optional; empty: one rate as before):

* ``matmul_classes``: ``((max_flops, efficiency), ...)`` ascending: a dot_general of at most
  ``max_flops`` FLOPs (per device, per op) runs at ``efficiency`` x ``peak(dtype)``; larger
  ones at the peak (``matmul_efficiency``);
* ``conv_classes``: ``((class, efficiency), ...)`` with class ``"<c>/<hw>"``, ``<c>`` "small-c"
  or "large-c" (the smaller of the input and output feature counts below ``CONV_CHANNELS``
  or not), ``<hw>`` "small-hw" or "large-hw" (the input's spatial elements per image below
  ``CONV_SPATIAL`` or not): a conv runs at ``efficiency`` x ``peak(dtype)``; a class not
  listed at ``conv_efficiency`` (``conv_class``, ``conv_efficiency_of``);
* weight-gradient convs (``jax.grad`` of a conv by its kernel: the window is the output
  gradient's image, the contracted feature the local batch ``f``) in their own classes:
  ``"wgrad/large-f"``, and, where the local batch is small (``f`` below ``WGRAD_FEATURES``) on a
  large image (``WGRAD_SPATIAL`` elements or more), ``"wgrad/small-f/<f>"``: a host's conv
  kernel runs that at a rate that grows with ``f`` (docs/performance.md's appendix). The
  listed efficiency of ``"wgrad/small-f"`` is the
  rate at ``f`` = 1; ``f`` features run ``f`` x that, at most ``"wgrad/large-f"``'s. So a data
  parallel plan whose local batch is 1 pays for its weight gradients where a spatial plan
  (the whole batch on each device, a tile of the image) does not;
* ``reduce_bandwidth``: bytes/s of memory-bound reductions (``reduce_sum`` ...; 0: the
  elementwise ``mem_bandwidth``).

``compute_seconds`` is the one function the cost model (model.py) and the search's cost
tables (search/tables.py) both call for an op's time, so that the two price alike.
Calibration (calibrate.py) measures every class; the presets' values are in hardware.py.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..ops import facts as F
from ..ops import facts_of

CONV_CHANNELS = 32  # a conv with fewer input or output features than this is "small-c"
CONV_SPATIAL = 1024  # an input image of fewer spatial elements (32 x 32) is "small-hw"
CONV_CLASSES = ("small-c/small-hw", "small-c/large-hw", "large-c/small-hw", "large-c/large-hw")
WGRAD_FEATURES = 8  # a weight-gradient conv contracting fewer features (its local batch) than this is "small-f"...
WGRAD_SPATIAL = 2048  # ... on an input image of at least this many spatial elements
WGRAD_CLASSES = ("wgrad/small-f", "wgrad/large-f")  # the names Hardware.conv_classes lists
REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "reduce_xor", "argmax", "argmin"))
CONV = "conv_general_dilated"


def conv_class(lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers,
               rhs_dilation: Optional[Sequence[int]] = None) -> str:
    """The shape class of a conv (per device): ``"small-c/large-hw"`` etc., or a weight
    gradient's ``"wgrad/large-f"`` / ``"wgrad/small-f/<f>"`` (module docstring).
    ``dimension_numbers``: lax's ``ConvDimensionNumbers`` (lhs_spec, rhs_spec, out_spec), or
    None for NCHW / OIHW; ``rhs_dilation``: the window's dilation (a strided conv's weight
    gradient dilates the output gradient by the stride), None for 1."""
    if dimension_numbers is None:
        lhs_spec, rhs_spec = tuple(range(len(lhs_shape))), tuple(range(len(rhs_shape)))
    else:
        lhs_spec, rhs_spec = dimension_numbers[0], dimension_numbers[1]
    cin = lhs_shape[lhs_spec[1]]
    cout = rhs_shape[rhs_spec[0]]
    spatial = window = 1
    for d in lhs_spec[2:]:
        spatial *= lhs_shape[d]
    for i, d in enumerate(rhs_spec[2:]):  # the window's extent, dilated
        window *= (rhs_shape[d] - 1) * (rhs_dilation[i] if rhs_dilation else 1) + 1
    if window >= 16 and 2 * window >= spatial:  # the window spans the image: a weight gradient
        if cin < WGRAD_FEATURES and spatial >= WGRAD_SPATIAL:
            return f"wgrad/small-f/{cin}"
        return "wgrad/large-f"
    c = "small-c" if min(cin, cout) < CONV_CHANNELS else "large-c"
    s = "small-hw" if spatial < CONV_SPATIAL else "large-hw"
    return f"{c}/{s}"


def matmul_efficiency(hw, flops: float) -> float:
    """Fraction of ``hw``'s matmul peak a dot_general of ``flops`` FLOPs reaches."""
    for bound, eff in getattr(hw, "matmul_classes", ()):
        if flops <= bound:
            return eff
    return 1.0


def conv_efficiency_of(hw, cls: Optional[str]) -> float:
    """Fraction of ``hw``'s matmul peak a conv of class ``cls`` reaches (``conv_efficiency``
    when the class is not listed or unknown). ``"wgrad/small-f/<f>"``: ``f`` x the listed
    ``"wgrad/small-f"`` efficiency, at most ``"wgrad/large-f"``'s (either one unlisted: the other,
    else ``conv_efficiency``)."""
    if cls is None:
        return hw.conv_efficiency
    listed = dict(getattr(hw, "conv_classes", ()))
    if cls.startswith("wgrad/small-f/"):
        large = listed.get("wgrad/large-f", hw.conv_efficiency)
        per = listed.get("wgrad/small-f")
        return large if per is None else min(large, per * int(cls.rsplit("/", 1)[1]))
    return listed.get(cls, hw.conv_efficiency)


def compute_seconds(hw, prim: str, flops: float, transcendentals: float, nbytes: float, dtype,
                    conv: Optional[str] = None) -> float:
    """Seconds of one op (per device, launch overhead not included): the larger of its FLOPs
    at its class's rate (dot_general: ``matmul_efficiency``; a conv: ``conv_efficiency_of``
    its class ``conv``; else the vector rate, transcendentals weighted) and its bytes at the
    memory bandwidth (``reduce_bandwidth`` for reductions)."""
    if prim == "dot_general":
        ct = flops / (hw.peak(dtype) * matmul_efficiency(hw, flops))
    elif prim == CONV:
        ct = flops / (hw.peak(dtype) * conv_efficiency_of(hw, conv))
    else:
        ct = (flops + transcendentals * (hw.transcendental_flops - 1)) / hw.vector_flops
    bw = hw.mem_bandwidth
    if prim in REDUCTIONS and getattr(hw, "reduce_bandwidth", 0.0):
        bw = hw.reduce_bandwidth
    return max(ct, nbytes / bw)


def op_seconds(hw, op, flops: float, nbytes: float, operand_dims) -> float:
    """``compute_seconds`` of one IR op (search/tables.py) at its local shapes: ``operand_dims``
    the mesh axes per dim of each operand (padded shards: an uneven split rounds up)."""
    kind = facts_of(op.prim).flops
    if not (kind == F.CONV_FLOPS or kind == F.DOT_FLOPS and len(op.inputs) == 2) or not op.inputs:
        return compute_seconds(hw, op.prim, flops, 0.0, nbytes, None)
    conv = None
    if kind == F.CONV_FLOPS and len(op.inputs) >= 2:
        local = [padded_shard_shape(v.shape, dims) for v, dims in zip(op.inputs, operand_dims)]
        conv = conv_class(local[0], local[1], op.params.get("dimension_numbers"), op.params.get("rhs_dilation"))
    return compute_seconds(hw, op.prim, flops, 0.0, nbytes, op.inputs[0].dtype, conv)


def padded_shard_shape(shape: Sequence[int], dims) -> tuple[int, ...]:
    """One device's shard of ``shape`` split over ``dims`` (the mesh axes per dim; an
    uneven split rounds up: the padded shard)."""
    out = []
    for n, axes in zip(shape, dims):
        k = 1
        for a in axes:
            k *= a.size
        out.append(-(-n // k))
    return tuple(out)
