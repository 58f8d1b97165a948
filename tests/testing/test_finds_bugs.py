"""gp.testing finds partitioner bugs: each class of bug is injected (monkeypatching the
partitioner's functions) and assert_spmd_equivalent fails within 200 examples, shrunk to a
reproducer of at most 3 ops on the smallest mesh (2 devices); a user function that differs from
its reference only on odd sizes is caught and shrunk to the smallest odd size."""
import re

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import gspmd_py.testing as gpt
from gspmd_py.partitioner import context, halo, hierarchy, windowed_handler

X = np.zeros((8, 6), np.float32)


def _failure(fn, *args, **kw) -> str:
    with pytest.raises(AssertionError) as e:
        gpt.assert_spmd_equivalent(fn, *args, max_examples=200, **kw)
    return str(e.value)


def _assert_small(msg: str, max_devices: int = 2):
    head = msg.splitlines()[0]
    assert "differs from" in head, msg[:2000]
    n_ops = int(re.search(r"(\d+) op\(s\)", head).group(1))
    assert 1 <= n_ops <= 3, head
    devices = re.search(r"devices (\[[^\]]*\])", head).group(1)
    assert len(eval(devices)) <= max_devices, head  # 2: the smallest mesh that can shard anything
    assert "reproducer (a standalone script)" in msg and "gp.spmd(fn, mesh" in msg


def test_dropped_all_reduce(monkeypatch):
    monkeypatch.setattr(hierarchy, "all_reduce_sum", lambda ctx, x, axes: x)
    msg = _failure(lambda x: jnp.sum(x, axis=0), X)
    _assert_small(msg)
    assert "why out0" in msg


def test_wrong_reduce_op(monkeypatch):
    real = context.Ctx.all_reduce
    monkeypatch.setattr(context.Ctx, "all_reduce",
                        lambda self, x, axes, kind="sum": real(self, x, axes, "max" if kind == "sum" else kind))
    _assert_small(_failure(lambda x, w: x @ w, X, np.zeros((6, 4), np.float32)))


def test_halo_one_row_short(monkeypatch):
    real = halo.gather

    def short(ctx, plan, x, d, fill):
        seg = real(ctx, plan, x, d, fill)
        lr = halo.neighbour_halos(plan)
        if lr is not None and lr[0]:  # the first row of the left halo never arrives: it keeps the fill value
            keep = lax.broadcasted_iota(jnp.int32, seg.shape, d) != 0
            seg = jnp.where(keep, seg, jnp.asarray(fill, seg.dtype))
        return seg

    monkeypatch.setattr(halo, "gather", short)
    monkeypatch.setattr(windowed_handler, "gather", short)
    window = lambda x: lax.reduce_window(x, 0.0, lax.add, (3, 1), (1, 1), "SAME")  # noqa: E731
    _assert_small(_failure(window, X))


def test_uneven_padding_off_by_one(monkeypatch):
    def valid(self, pv, d):  # one padding row counted as real
        n, axes = pv.shape[d], pv.dims[d]
        c = -(-n // self.k(axes)) if axes else n
        return (lax.iota(jnp.int32, c) + self.offset(n, axes)) < n + 1

    monkeypatch.setattr(context.Ctx, "valid", valid)
    msg = _failure(lambda x: jnp.max(x, axis=0), X - 5.0)
    _assert_small(msg)


def test_user_function_wrong_on_odd_sizes():
    """fn differs from its reference only when dim 0 is odd and above 1: shrunk to size 3."""
    fn = lambda x: x * 2 + jnp.where(x.shape[0] % 2 == 1 and x.shape[0] > 1, 1.0, 0.0)  # noqa: E731
    msg = _failure(fn, X, reference=lambda x: x * 2)
    inputs = re.search(r"inputs: f32\[(\d+), (\d+)\]", msg)
    assert inputs and int(inputs.group(1)) == 3, msg[:1500]
    assert int(inputs.group(2)) == 1, msg[:1500]  # the other dim shrinks to its smallest non-empty size
