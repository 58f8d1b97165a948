"""Primitives gspmd_py refuses on purpose, each with the one-line reason that the
``UnsupportedOpError`` naming it carries (ops/registry.py). Every other primitive of JAX's
public surface has a sharding rule, or is inlined / read by the tracer (frontend/trace.py);
tests/frontend/test_primitive_coverage.py checks that on the installed JAX.
"""
from __future__ import annotations

from types import MappingProxyType

_NAMED_AXIS = ("a collective over a named mesh axis, which only a shard_map / pmap body has: gp.spmd "
               "partitions a single-device function (annotate its values; gspmd_py emits the collectives)")
_TOKEN = "an ordering token of effects (infeed / outfeed era): gspmd_py programs order host effects themselves"
_REF = ("a mutable array reference (jax.new_ref / Pallas state): gspmd_py partitions values, "
        "not memory locations")

REFUSED = MappingProxyType({
    "psum": _NAMED_AXIS,
    "pmax": _NAMED_AXIS,
    "pmin": _NAMED_AXIS,
    "ppermute": _NAMED_AXIS,
    "all_gather": _NAMED_AXIS,
    "all_to_all": _NAMED_AXIS,
    "ragged_all_to_all": _NAMED_AXIS,
    "psum_scatter": _NAMED_AXIS,
    "reduce_scatter": _NAMED_AXIS,
    "axis_index": _NAMED_AXIS,
    "xla_pmap": "jax.pmap inside the function: gspmd_py partitions one program over the mesh instead",
    "after_all": _TOKEN,
    "create_token": _TOKEN,
    "get": _REF,
    "swap": _REF,
    "addupdate": _REF,
    "select_and_scatter": ("a select-and-scatter with arbitrary select / scatter computations (JAX's own "
                           "max-pool gradient emits select_and_scatter_add, which has a rule)"),
})


def reason(prim: str) -> str:
    """Why ``prim`` is refused ('' when it is not)."""
    return REFUSED.get(prim, "")
