"""Arrays ``plan.place`` padded: global jax.Arrays that remember the logical shape they stand for.

``plan.place([x])`` gives the compiled program's own arguments: an uneven input comes back
padded to whole shards (``f32[16,74]`` over 8 devices: ``f32[16,80]``), as ``plan.lower().compile()``
takes it. Passed back to a gp.spmd function, such an array must not be planned and computed
on as ``f32[16,80]`` data (``x.mean(axis=1)`` would average the padding). So ``place`` marks
each array it padded with its logical shape (an attribute on the array itself: the mark lives
and dies with it, no registry), and the call path reads the mark:

* the plan cache key and the plan's avals use the logical shape (``logical_shape``);
* the boundary passes the padded array straight in when the plan pads that input to the
  same shape (the padding sits at the end of each dim, as every plan lays it out), and
  otherwise cuts it back to its logical shape first (``unpad``).

    >>> placed = plan.place([x])          # placed[0].shape == (16, 80), logical_shape(placed[0]) == (16, 74)
    >>> f(*placed)                        # == f(x): planned at (16, 74), the padded array passed as is
"""
from __future__ import annotations

from typing import Any, Optional

import jax

#: The attribute ``place`` sets on an array it padded: its logical shape.
MARK = "_gspmd_py_logical_shape"


def mark(x: Any, shape) -> Any:
    """``x`` (a padded jax.Array ``place`` made) marked as standing for an array of ``shape``."""
    setattr(x, MARK, tuple(shape))
    return x


def logical_shape(x: Any) -> Optional[tuple[int, ...]]:
    """The logical shape of an array ``place`` padded, else None."""
    return getattr(x, MARK, None) if isinstance(x, jax.Array) else None


def unpad(x: Any, shape) -> jax.Array:
    """A padded array cut back to its logical ``shape`` (the padding is at the end of each dim)."""
    return x[tuple(slice(0, n) for n in shape)]
