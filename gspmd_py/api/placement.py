"""``gp.rank_meshes``: device orders of a mesh ranked for one program on one hardware.

P² (Xie et al., arXiv 2110.10548): which mesh axis keeps its groups inside a node (its
placement on the hierarchy) changes a reduction's time more than its algorithm does. A
placement here is the order of the mesh axes from major to minor in device ids: the minor
axis varies fastest, so its groups are the devices next to each other (inside a node, on
one chip, along the first torus dimension)::

    >>> import jax, jax.numpy as jnp, gspmd_py as gp
    >>> f = lambda x, w: (x @ w).sum(0)
    >>> S = jax.ShapeDtypeStruct
    >>> ranked = gp.rank_meshes(f, (4, 2), ("data", "model"), gp.Hardware.preset("h100-node", node_size=2),
    ...                         S((64, 128), jnp.float32), S((128, 256), jnp.float32),
    ...                         in_shardings=(gp.P("data", None), gp.P(None, "model")))
    >>> [r.order for r in ranked]      # "data" inside a node: its sum runs on NVLink
    [('model', 'data'), ('data', 'model')]

Each candidate is planned on an abstract mesh whose axes are laid out in that order (the
same groups of device ids as ``gp.Mesh(shape, names, devices=p.device_ids)``), with
``hardware=hw`` (hierarchy-aware reductions; ``shaped=False``: the plain program), and
priced by ``plan.cost(hw, overlap=True)``. Ties keep the mesh's own order first.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional, Sequence

import attrs
import numpy as np

from ..core.errors import HardwareError, MeshError
from ..core.mesh import Mesh


@attrs.frozen
class Placement:
    """One device order of a mesh of ``shape`` and axis ``names``: ``order`` (mesh axes, major to minor in device ids), ``device_ids``
    (flat, the mesh's row-major order: pass to ``gp.Mesh(shape, names, devices=...)``), the
    predicted ``step_s`` / ``comm_s`` and the whole ``cost`` (gp.Cost)."""

    shape: tuple[int, ...]
    names: tuple[str, ...]
    order: tuple[str, ...]
    device_ids: tuple[int, ...]
    step_s: float
    comm_s: float
    cost: object = attrs.field(eq=False, repr=False)

    def mesh(self) -> Mesh:
        """The placement as a gp.Mesh over this process's devices (needs that many)."""
        return Mesh(self.shape, self.names, devices=list(self.device_ids))

    def __str__(self) -> str:
        return (f"{' > '.join(self.order)} (minor last): step {self.step_s * 1e3:.3f} ms, "
                f"communication {self.comm_s * 1e3:.3f} ms")


def placement_ids(shape: Sequence[int], names: Sequence[str], order: Sequence[str]) -> np.ndarray:
    """Device ids in mesh shape when the axes are numbered in ``order`` (major first)."""
    perm = [list(names).index(a) for a in order]
    ids = np.arange(int(np.prod(shape)), dtype=np.int64).reshape([shape[i] for i in perm])
    return ids.transpose(np.argsort(perm))


def rank_meshes(fn: Callable, shape: Sequence[int], names: Sequence[str], hw, *args, in_shardings=None,
                out_shardings=None, shaped: bool = True, top: Optional[int] = None, **spmd_kw) -> list[Placement]:
    """Every device order of a ``shape`` mesh named ``names`` (one per order of its axes of
    size > 1), fastest predicted step first. ``args``: arrays or jax.ShapeDtypeStructs."""
    from .api import spmd
    from ..cost.hardware import Hardware

    if not isinstance(hw, Hardware):
        raise HardwareError(f"gp.rank_meshes needs a gp.Hardware, got {type(hw).__name__}")
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names):
        raise MeshError(f"gp.rank_meshes: mesh shape {shape} has {len(shape)} axes but {len(names)} names {names}")
    Mesh.abstract(shape, names)  # checks sizes and names
    big = [a for a, n in zip(names, shape) if n > 1]
    orders, seen = [], set()
    for perm in itertools.permutations(big):
        it = iter(perm)
        order = tuple(next(it) if n > 1 else a for a, n in zip(names, shape))
        if order not in seen:
            seen.add(order)
            orders.append(order)
    out = []
    for order in orders:
        mesh = Mesh.abstract([shape[names.index(a)] for a in order], order)
        f = spmd(fn, mesh, in_shardings=in_shardings, out_shardings=out_shardings,
                 hardware=hw if shaped else None, **spmd_kw)
        c = f.plan(*args).cost(hw, overlap=True)
        ids = placement_ids(shape, names, order)
        out.append(Placement(shape, names, order, tuple(int(i) for i in ids.reshape(-1)), c.step_s, c.comm_s, c))
    out = [p for _, p in sorted(enumerate(out), key=lambda t: (t[1].step_s, t[0]))]
    return out[:top] if top else out
