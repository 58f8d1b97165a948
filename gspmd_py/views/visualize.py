"""Tile grids: which devices hold which part of a value, as ``jax.debug.visualize_array_sharding``.

``tile_grid(sharding, shape)`` lays a value's tiles out as rows x columns (a matrix's rows down
and columns across, as jax draws it; for rank > 2 the leading dims down and the others across,
split so that the grid is about square); ``render_text`` draws it with box characters, ``render_rich`` as a
coloured ``rich`` table, and html.py as SVG. On ``Mesh((2, 4), ("x", "y"))``, ``P("x", "y")``
of an f32[8,16]::

    >>> print(render_text(tile_grid(gp.Sharding(mesh, gp.P("x", "y")), (8, 16))))
    ┌─────────┬─────────┬──────────┬──────────┐
    │  dev 0  │  dev 1  │  dev 2   │  dev 3   │
    │ 0:4,0:4 │ 0:4,4:8 │ 0:4,8:12 │0:4,12:16 │
    ├─────────┼─────────┼──────────┼──────────┤
    ...

A cell lists every device holding the tile (replicas too); grids larger than 16 tiles a
side are cut in the middle (a ``…`` row / column).
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs
import numpy as np

from ..core.sharding import Sharding

MAX_SIDE = 16


@attrs.frozen
class Cell:
    devices: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]  # per dim: [start, stop) of the global index

    def device_text(self, limit: int = 6) -> str:
        ds = [str(d) for d in self.devices]
        if len(ds) > limit:
            ds = ds[: limit - 1] + ["…", ds[-1]]
        return ("dev " if len(self.devices) == 1 else "devs ") + ",".join(ds)

    def range_text(self) -> str:
        return ",".join(f"{a}:{b}" for a, b in self.ranges)


@attrs.frozen
class TileGrid:
    """Rows x columns of Cells (None: an elided row/column); row and column extents for drawing."""

    cells: tuple[tuple[Optional[Cell], ...], ...]
    row_sizes: tuple[int, ...]
    col_sizes: tuple[int, ...]
    note: str = ""


def _ranges(n: int, k: int) -> list[tuple[int, int]]:
    c = -(-n // k) if k else n
    return [(min(i * c, n), min((i + 1) * c, n)) for i in range(k)]


def _shown(n: int) -> list[Optional[int]]:
    if n <= MAX_SIDE:
        return list(range(n))
    half = MAX_SIDE // 2
    return list(range(half)) + [None] + list(range(n - half + 1, n))


def _split(shards: Sequence[int]) -> int:
    """Dims [0, k) go down the rows, [k, rank) across: k = 1 for rank <= 2 (as jax draws), else the
    split that makes the grid closest to square (wider on a tie)."""
    r = len(shards)
    if r <= 2:
        return min(r, 1) if r == 2 else 0
    best = min(range(1, r), key=lambda k: (abs(np.log(max(np.prod(shards[:k]), 1)) -
                                               np.log(max(np.prod(shards[k:]), 1))), k))
    return best


def tile_grid(sharding: Sharding, shape: Sequence[int]) -> TileGrid:
    """The tiles of a value of ``shape`` laid out by ``sharding`` (see the module docstring)."""
    shape = tuple(int(n) for n in shape)
    s = sharding.with_rank(len(shape)) if sharding.rank < len(shape) else sharding
    shards = tuple(s.shards)
    ta = s.tile_assignment
    repl = ta.shape[-1] if ta.ndim > len(shards) else 1
    ta = ta.reshape(shards + (repl,))
    ranges = [_ranges(n, k) for n, k in zip(shape, shards)]
    k = _split(shards)
    lead, tail = shards[:k], shards[k:]
    n_rows = int(np.prod(lead, dtype=np.int64))
    n_cols = int(np.prod(tail, dtype=np.int64))
    rows, cols = _shown(n_rows), _shown(n_cols)

    def extent(dims, idx):
        return int(np.prod([ranges[d][i][1] - ranges[d][i][0] for d, i in zip(dims, idx)], dtype=np.int64))

    cells, row_sz, col_sz = [], [], []
    for c in cols:
        col_sz.append(0 if c is None else extent(range(k, len(shards)), np.unravel_index(c, tail)) if tail else 1)
    for r in rows:
        ridx = tuple(int(i) for i in np.unravel_index(r, lead)) if r is not None and lead else ()
        row_sz.append(0 if r is None else extent(range(k), ridx) if lead else 1)
        line: list[Optional[Cell]] = []
        for c in cols:
            if r is None or c is None:
                line.append(None)
                continue
            idx = ridx + (tuple(int(i) for i in np.unravel_index(c, tail)) if tail else ())
            devs = tuple(int(d) for d in np.asarray(ta[idx]).reshape(-1))
            line.append(Cell(devs, tuple(ranges[d][i] for d, i in enumerate(idx))))
        cells.append(tuple(line))
    note = ""
    if sharding.partial:
        note = "partial sums over " + ",".join(str(a) for a in sharding.partial)
    return TileGrid(tuple(cells), tuple(row_sz), tuple(col_sz), note)


def _cell_lines(cell: Optional[Cell]) -> list[str]:
    return ["…", ""] if cell is None else [cell.device_text(), cell.range_text()]


def render_text(grid: TileGrid) -> str:
    """The grid drawn with box characters (no colours)."""
    texts = [[_cell_lines(c) for c in row] for row in grid.cells]
    ncol = len(grid.cells[0]) if grid.cells else 0
    width = [max(len(l) for row in texts for l in row[j]) + 2 for j in range(ncol)]

    def rule(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * w for w in width) + right

    out = [rule("┌", "┬", "┐")]
    for i, row in enumerate(texts):
        for k in range(2):
            out.append("│" + "│".join(row[j][k].center(width[j]) for j in range(ncol)) + "│")
        out.append(rule("├", "┼", "┤") if i < len(texts) - 1 else rule("└", "┴", "┘"))
    if grid.note:
        out.append(grid.note)
    return "\n".join(out)


PALETTE = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
           "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f", "#a6cee3", "#b2df8a", "#fb9a99", "#cab2d6")


def color_of(cell: Optional[Cell]) -> str:
    """A colour per device group: the same devices, the same colour, in every picture."""
    if cell is None:
        return "#ffffff"
    return PALETTE[min(cell.devices) % len(PALETTE)] if cell.devices else "#ffffff"


def render_rich(grid: TileGrid, title: str = ""):
    """The grid as a coloured ``rich.table.Table`` (needs rich)."""
    from rich import box
    from rich.align import Align
    from rich.table import Table
    from rich.text import Text

    t = Table(show_header=False, show_lines=True, box=box.SQUARE, padding=(0, 1), title=title or None)
    for _ in (grid.cells[0] if grid.cells else ()):
        t.add_column(justify="center")
    for row in grid.cells:
        t.add_row(*[Align.center(Text("\n".join(_cell_lines(c)), style=f"black on {color_of(c)}")) for c in row])
    return t


def visualize(sharding: Sharding, shape: Sequence[int], title: str = "", *, show: bool = True,
              use_rich: Optional[bool] = None) -> str:
    """Print the tile grid (coloured with rich when installed and ``use_rich`` is not False) and
    return it as plain text."""
    grid = tile_grid(sharding, shape)
    text = (title + "\n" if title else "") + render_text(grid)
    if show:
        if use_rich is None:
            try:
                import rich  # noqa: F401

                use_rich = True
            except ImportError:
                use_rich = False
        if use_rich:
            from rich.console import Console

            console = Console()
            if title:
                console.print(title, highlight=False)
            console.print(render_rich(grid))
            if grid.note:
                console.print(grid.note, highlight=False)
        else:
            print(text)
    return text
