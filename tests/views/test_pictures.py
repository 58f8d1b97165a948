"""plan.visualize and plan.save_html (issue 10.7)."""
import html.parser

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

import gspmd_py as gp
from gspmd_py.views.visualize import render_text, tile_grid

P = gp.P
S = jax.ShapeDtypeStruct


@pytest.fixture(scope="module")
def plan(mesh):
    """A Megatron MLP's loss gradient: tags, an annotation, a with_sharding_constraint, collectives."""
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def loss(w1, w2, x):
        h = gp.tag(jax.nn.relu(x @ w1), "hidden")
        h = jax.lax.with_sharding_constraint(h, NamedSharding(jm, PS("x", "y")))
        y = gp.annotate(h @ w2, P("x", None))
        return gp.tag((y ** 2).mean(), "loss<&>")
    g = jax.grad(loss, argnums=(0, 1))
    f = gp.spmd(g, mesh, in_shardings=(P(None, "y"), P("y", None), P("x", None)))
    return f.plan(S((16, 32), jnp.float32), S((32, 16), jnp.float32), S((8, 16), jnp.float32))


def test_tile_grid_text(mesh):
    text = render_text(tile_grid(gp.Sharding(mesh, P("x", "y")), (8, 16)))
    lines = text.splitlines()
    assert len(lines) == 7 and lines[0].startswith("┌") and lines[-1].startswith("└")
    assert "dev 0" in lines[1] and "dev 3" in lines[1] and "0:4,12:16" in lines[2]
    assert "dev 7" in lines[4] and "4:8,12:16" in lines[5]
    # partially tiled: every replica is listed; uneven dims show their short last tile
    text = render_text(tile_grid(gp.Sharding(mesh, P("y")), (13,)))
    assert "devs 0,4" in text and "devs 3,7" in text and "12:13" in text
    # a permuted device order shows up in the picture
    m2 = gp.Mesh((2, 4), ("x", "y"), devices=[7, 6, 5, 4, 3, 2, 1, 0])
    assert render_text(tile_grid(gp.Sharding(m2, P("x", "y")), (2, 4))).splitlines()[1].split() == \
        ["│", "dev", "7", "│", "dev", "6", "│", "dev", "5", "│", "dev", "4", "│"]


def test_tile_grid_large_mesh_is_cut():
    m = gp.Mesh.abstract((64, 128), ("x", "y"))
    lines = render_text(tile_grid(gp.Sharding(m, P("x", "y")), (128, 256))).splitlines()
    assert len(lines) == 3 * 16 + 1 and "…" in lines[1] and "dev 127" in lines[1]


def test_visualize(plan, capsys):
    text = plan.visualize("hidden", show=False)
    assert text.splitlines()[0].startswith("hidden f32[8,32] P('x', 'y')")
    assert "dev 0" in text and "0:4,0:8" in text
    plan.visualize("hidden")
    printed = capsys.readouterr().out
    assert "hidden" in printed and "dev 7" in printed and "4:8,24:32" in printed
    with pytest.raises(gp.ShardingError, match="no value named 'nope'"):
        plan.visualize("nope")


class _Page(html.parser.HTMLParser):
    """Checks nesting (every non-void element closed in order) and collects table rows and text."""

    VOID = {"meta", "br", "rect", "link", "img", "hr", "input"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tables = [], [], {}
        self.table, self.row, self.cell, self.text, self.svgs = None, None, None, [], 0
        self.tags = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        if tag in ("script", "link", "iframe", "img") or any(
                (v or "").startswith(("http:", "https:", "//")) for k, v in attrs.items() if k in ("src", "href")):
            self.errors.append(f"external or scripted content: <{tag} {attrs}>")
        if tag == "svg":
            self.svgs += 1
        if tag == "table":
            self.table = attrs.get("class", "")
            self.tables[self.table] = []
        if tag == "tr":
            self.row = []
        if tag in ("td", "th"):
            self.cell = []
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.add(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag in ("td", "th"):
            self.row.append("".join(self.cell))
            self.cell = None
        if tag == "tr" and self.table is not None:
            self.tables[self.table].append(self.row)

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def test_save_html(plan, tmp_path):
    path = tmp_path / "plan.html"
    text = plan.save_html(str(path))
    assert path.read_text(encoding="utf-8") == text
    page = _Page()
    page.feed(text)
    page.close()
    assert not page.errors and not page.stack, (page.errors, page.stack)
    assert {"html", "head", "style", "body", "table", "svg", "pre"} <= page.tags
    body = "".join(page.text)
    # every collective, in program order, with its bytes
    rows = page.tables["collectives"][1:]
    assert len(rows) == len(plan.collectives) >= 2
    for row, c in zip(rows, plan.collectives):
        assert row[:4] == [str(rows.index(row)), c.kind, ",".join(c.axes), f"{c.bytes_per_device:,}"]
        assert row[5:] == [str(c.tensors), c.op] and row[4].startswith(c.dtype[:1])
    # every tagged / annotated value: a card with its sharding, tile grid and explain chain
    for name in ("hidden", "loss<&>", "hidden/grad"):
        assert name in body, name
        assert plan.explain(name) in body
    assert "jax.lax.with_sharding_constraint" in body and "gp.annotate" in body
    assert page.svgs >= len(plan.graph.inputs) + 3
    # the per-op table has a row per op result
    boundary = sum(c.op_id == -1 for c in plan.collectives)  # boundary and combined collectives
    assert len(page.tables["ops"]) - 1 == sum(len(op.outputs) for op in plan.graph.walk()) + len(plan.graph.inputs) \
        + boundary
    # the report's summary line and the per-device program
    assert plan.report().splitlines()[-1] in body
    assert plan.spmd_text().splitlines()[0] in body
