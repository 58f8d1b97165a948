"""The reference programs, each written once for both contestants.

A program is a factory ``make(constrain)`` returning a FRESH Python function (so that
first-call times include tracing), where ``constrain(x, spec)`` is ``gp.annotate`` for
gspmd_py and ``with_sharding_constraint`` for ``jax.jit``::

    prog = PROGRAMS["megatron_mlp"]
    fn = prog.make(lambda x, spec: x)          # unannotated reference
    args = prog.args(quick=False)              # numpy arrays

``in_specs``/``out_specs`` are gp.P (or None: propagation / XLA decides) per argument /
output; the jax.jit side gets them as NamedShardings, with the axes of dims they do
not divide dropped (jax.Arrays must divide evenly; inside the function the annotation
still says the uneven sharding, and XLA pads as gspmd_py does).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import attrs
import numpy as np

Constrain = Callable[[Any, Any], Any]


@attrs.frozen
class Program:
    name: str
    title: str
    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    make: Callable[[Constrain], Callable]
    shapes: Callable[[bool], list[tuple[tuple[int, ...], float]]]  # (shape, scale) per argument
    in_specs: tuple
    out_specs: Any = None
    int_args: tuple[int, ...] = ()  # arguments drawn as int32 in [0, scale)

    def args(self, quick: bool = False, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for i, (shape, scale) in enumerate(self.shapes(quick)):
            if i in self.int_args:
                out.append(rng.integers(0, int(scale), size=shape).astype(np.int32))
            else:
                out.append((rng.standard_normal(shape) * scale).astype(np.float32))
        return out


def _P():
    import gspmd_py as gp

    return gp.P


# ---------------------------------------------------------------------------------------------
# Megatron MLP: column- then row-parallel matmuls, data parallel on x: 1 all-reduce
# ---------------------------------------------------------------------------------------------

def _mlp(constrain: Constrain):
    import jax

    def megatron_mlp(x, w1, w2):
        h = jax.nn.gelu(x @ w1)
        return h @ w2

    return megatron_mlp


def _mlp_shapes(quick):
    b, d, f = (256, 256, 1024) if quick else (512, 512, 2048)
    return [((b, d), 1.0), ((d, f), d ** -0.5), ((f, d), f ** -0.5)]


# ---------------------------------------------------------------------------------------------
# transformer block (gspmd_py.demo): heads and MLP over y, batch over x
# ---------------------------------------------------------------------------------------------

def _block_fwd(constrain: Constrain):
    from gspmd_py.demo import transformer_block

    def block(*a):
        return transformer_block(*a)

    return block


def _block_grad(constrain: Constrain):
    import jax

    from gspmd_py.demo import transformer_block

    def loss(*a):
        return transformer_block(*a).sum()

    g = jax.grad(loss, argnums=tuple(range(9)))

    def block_grad(*a):
        return g(*a)

    return block_grad


def block_shapes(b, t, d, h, k, f):
    return [((b, t, d), 1.0), ((d, h, k), d ** -0.5), ((d, h, k), d ** -0.5), ((d, h, k), d ** -0.5),
            ((h, k, d), (h * k) ** -0.5), ((d, f), d ** -0.5), ((f, d), f ** -0.5), ((d,), 1.0), ((d,), 1.0)]


def _block_shapes(quick):
    return block_shapes(*((4, 32, 128, 8, 16, 512) if quick else (8, 64, 256, 8, 32, 1024)))


def block_in_specs():
    P = _P()
    return (P("x", None, None), P(None, "y", None), P(None, "y", None), P(None, "y", None), P("y", None, None),
            P(None, "y"), P("y", None), None, None)


# ---------------------------------------------------------------------------------------------
# GSPMD paper's 2D-sharded FFN: 3 all-gathers + 1 reduce-scatter
# ---------------------------------------------------------------------------------------------

def _ffn2d(constrain: Constrain):
    import jax
    import jax.numpy as jnp

    def ffn_2d(x, wi, wo):
        h = jax.nn.relu(jnp.einsum("bsm,mh->bsh", x, wi))
        return jnp.einsum("bsh,hm->bsm", h, wo)

    return ffn_2d


def _ffn2d_shapes(quick):
    b, s, m, h = (8, 64, 256, 1024) if quick else (16, 128, 512, 2048)
    return [((b, s, m), 1.0), ((m, h), m ** -0.5), ((h, m), h ** -0.5)]


# ---------------------------------------------------------------------------------------------
# spatially partitioned conv net: H over y (halo exchange), batch over x
# ---------------------------------------------------------------------------------------------

def _conv(constrain: Constrain):
    import jax
    from jax import lax

    P = _P()
    dn = ("NHWC", "HWIO", "NHWC")

    def conv_net(x, w1, w2, w3):
        h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
        h = constrain(h, P("x", "y", None, None))
        h = jax.nn.relu(lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn))
        h = lax.reduce_window(h, -np.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = constrain(h, P("x", "y", None, None))
        return jax.nn.relu(lax.conv_general_dilated(h, w3, (1, 1), "SAME", dimension_numbers=dn))

    return conv_net


def _conv_shapes(quick):
    n, hw, c = (4, 32, 16) if quick else (8, 64, 32)
    return [((n, hw, hw, c), 1.0), ((3, 3, c, c), (9 * c) ** -0.5), ((3, 3, c, c), (9 * c) ** -0.5),
            ((3, 3, c, c), (9 * c) ** -0.5)]


# ---------------------------------------------------------------------------------------------
# GShard-style MoE layer: groups and experts both on axis x (dispatch/combine = all-to-all)
# ---------------------------------------------------------------------------------------------

MOE_CAPACITY = 2.0


def _moe(constrain: Constrain):
    import jax
    import jax.numpy as jnp

    P = _P()

    def moe_layer(x, wg, wi, wo):
        g, s, m = x.shape
        e = wg.shape[1]
        cap = int(MOE_CAPACITY * s / e)
        gates = jax.nn.softmax(jnp.einsum("gsm,me->gse", x, wg), axis=-1)
        expert = jnp.argmax(gates, axis=-1)  # top-1
        mask = jax.nn.one_hot(expert, e, dtype=x.dtype)  # [g, s, e]
        pos = jnp.cumsum(mask, axis=1) * mask - 1.0  # position in the expert's buffer
        keep = mask * (pos < cap)
        slot = jax.nn.one_hot(pos.astype(jnp.int32), cap, dtype=x.dtype)  # [g, s, e, c]
        dispatch = keep[..., None] * slot
        combine = dispatch * jnp.sum(gates * mask, axis=-1)[:, :, None, None]
        xe = constrain(jnp.einsum("gsec,gsm->egcm", dispatch, x), P("x", None, None, None))
        h = jax.nn.relu(jnp.einsum("egcm,emh->egch", xe, wi))
        ye = constrain(jnp.einsum("egch,ehm->egcm", h, wo), P("x", None, None, None))
        return constrain(jnp.einsum("gsec,egcm->gsm", combine, ye), P("x", None, None))

    return moe_layer


def _moe_shapes(quick):
    g, s, m, e, h = (8, 64, 64, 8, 128) if quick else (8, 256, 256, 8, 512)
    return [((g, s, m), 1.0), ((m, e), m ** -0.5), ((e, m, h), m ** -0.5), ((e, h, m), h ** -0.5)]


# ---------------------------------------------------------------------------------------------
# uneven: no dim divides its shard count
# ---------------------------------------------------------------------------------------------

def _uneven(constrain: Constrain):
    import jax.numpy as jnp

    P = _P()

    def uneven(x, w, b):
        # the in_shardings again, as constraints: jax.jit's in_shardings cannot say them
        x, w = constrain(x, P("x", "y")), constrain(w, P("y", None))
        return constrain(jnp.tanh(x @ w + b) * 2.0, P("x", None))

    return uneven


def _uneven_shapes(quick):
    n, d, f = (255, 127, 61) if quick else (1023, 509, 257)
    return [((n, d), 1.0), ((d, f), d ** -0.5), ((f,), 1.0)]


# ---------------------------------------------------------------------------------------------
# scanned transformer stack (flax nn.scan / hk.layer_stack style): weights stacked [L, ...],
# Megatron over y inside, batch over x; the training step's gradient
# ---------------------------------------------------------------------------------------------

SCAN_LAYERS = 4


def _scan_grad(constrain: Constrain):
    import jax
    from jax import lax

    from gspmd_py.demo import transformer_block

    def loss(x, *stack):
        def layer(h, w):
            return transformer_block(h, *w), None

        h, _ = lax.scan(layer, x, stack)
        return h.sum()

    g = jax.grad(loss, argnums=tuple(range(1, 9)))

    def scan_block_grad(*a):
        return g(*a)

    return scan_block_grad


def _scan_shapes(quick):
    shapes = _block_shapes(quick)
    return [shapes[0]] + [((SCAN_LAYERS,) + s, sc) for s, sc in shapes[1:]]


def scan_in_specs():
    P = _P()
    return (block_in_specs()[0],) + tuple(P(None, *s) if s is not None else None for s in block_in_specs()[1:])


# ---------------------------------------------------------------------------------------------
# GSPMD pipelining (paper §3.3), hand-written: stage-stacked weights on "pipe", stages vmapped,
# the state shifted by jnp.roll each iteration, batch over "data"
# ---------------------------------------------------------------------------------------------

PIPE_MICRO = 8


def _pipeline(constrain: Constrain):
    import jax
    import jax.numpy as jnp
    from jax import lax

    P = _P()

    def stage(w, h):
        return jnp.tanh(h @ w)

    def pipelined(x, ws):
        s, m = ws.shape[0], PIPE_MICRO
        mb = x.shape[0] // m
        xs = jnp.swapaxes(x.reshape((mb, m) + x.shape[1:]), 0, 1)  # [M, mb, d]
        state = constrain(jnp.zeros((s,) + xs.shape[1:], x.dtype), P("pipe", "data", None))
        outs = constrain(jnp.zeros((s,) + xs.shape, x.dtype), P("pipe", None, "data", None))
        stages = lax.iota(jnp.int32, s)

        def body(carry, t):
            state, outs = carry
            recv = constrain(jnp.roll(state, 1, axis=0), P("pipe", "data", None))
            inp = jnp.where((stages == 0)[:, None, None], lax.dynamic_index_in_dim(xs, t % m, 0), recv)
            y = constrain(jax.vmap(stage)(ws, inp), P("pipe", "data", None))
            done = ((stages == s - 1) & (t >= s - 1))[:, None, None, None]
            outs = jnp.where(done, lax.dynamic_update_index_in_dim(outs, y, (t - (s - 1)) % m, 1), outs)
            return (y, constrain(outs, P("pipe", None, "data", None))), None

        (_, outs), _ = lax.scan(body, (state, outs), jnp.arange(m + s - 1))
        return jnp.swapaxes(outs[s - 1], 0, 1).reshape(x.shape)

    return pipelined


def _pipeline_shapes(quick):
    b, d = (64, 128) if quick else (256, 512)
    return [((b, d), 1.0), ((4, d, d), d ** -0.5)]


def _programs() -> dict[str, Program]:
    P = _P()
    xy = ((2, 4), ("x", "y"))
    return {p.name: p for p in [
        Program("megatron_mlp", "Megatron MLP", *xy, _mlp, _mlp_shapes,
                (P("x", None), P(None, "y"), P("y", None))),
        Program("block_fwd", "transformer block", *xy, _block_fwd, _block_shapes, block_in_specs()),
        Program("block_grad", "transformer block grad", *xy, _block_grad, _block_shapes, block_in_specs()),
        Program("ffn_2d", "GSPMD 2D FFN", (2, 4), ("X", "Y"), _ffn2d, _ffn2d_shapes,
                (P("X", None, "Y"), P("X", "Y"), P("Y", "X")), P("X", None, "Y")),
        Program("conv_net", "spatial conv net", *xy, _conv, _conv_shapes,
                (P("x", "y", None, None), None, None, None), P("x", "y", None, None)),
        Program("moe", "MoE layer (GShard)", (8,), ("x",), _moe, _moe_shapes,
                (P("x", None, None), None, P("x", None, None), P("x", None, None)), P("x", None, None)),
        Program("uneven", "uneven dims", *xy, _uneven, _uneven_shapes,
                (P("x", "y"), P("y", None), None), P("x", None)),
        Program("scan_block_grad", f"scanned transformer grad ({SCAN_LAYERS} layers)", *xy, _scan_grad, _scan_shapes,
                scan_in_specs()),
        Program("pipeline", "GSPMD pipeline (4 stages, 8 microbatches)", (2, 4), ("data", "pipe"), _pipeline,
                _pipeline_shapes, (P("data", None), P("pipe", None, None)), P("data", None)),
    ]}


_CACHE: dict[str, dict[str, Program]] = {}


def programs() -> dict[str, Program]:
    if "all" not in _CACHE:
        _CACHE["all"] = _programs()
    return _CACHE["all"]


def gp_constrain(x, spec):
    import gspmd_py as gp

    return gp.annotate(x, spec)


def jax_constrain_for(jax_mesh) -> Constrain:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    def constrain(x, spec):
        return jax.lax.with_sharding_constraint(x, NamedSharding(jax_mesh, PartitionSpec(*spec)))

    return constrain


def even_spec(spec, shape, mesh_sizes: dict[str, int]) -> Optional[Any]:
    """``spec`` with the axes of dims they do not divide dropped (None stays None)."""
    if spec is None:
        return None
    from jax.sharding import PartitionSpec

    out = []
    for n, e in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if e is None else ((e,) if isinstance(e, str) else tuple(e))
        k = int(np.prod([mesh_sizes[a] for a in names], dtype=np.int64)) if names else 1
        out.append(e if n % k == 0 else None)
    return PartitionSpec(*out)
