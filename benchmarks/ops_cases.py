"""One small program per op family of the rule registry (``gspmd_py.ops.registry``), for
``benchmarks/ops.py``: each names the rule function it exercises (``family``), builds its
arguments, and is run with its FIRST argument sharded the ways users shard it (the others
as ``extra`` says, else replicated)::

    Case("gather", "embedding", lambda t, i: jnp.take(t, i, axis=0), [((V, D), f32), ((B, S), i32)])

``variants(case, mesh)`` turns a case into (name, in_specs, args): replicated, batch (dim 0
over every mesh axis), dim d over every mesh axis for each other dim, uneven (dim 0 one row
longer than the shard count divides), plus the case's ``extra`` specs.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs
import numpy as np

F32, I32 = np.float32, np.int32


@attrs.frozen
class Case:
    family: str  # the rule function's name (registry.rule_functions())
    name: str
    fn: Callable
    shapes: tuple  # ((shape, dtype), ...) at full size
    quick_shapes: tuple = ()  # the same at --quick size (default: the full ones)
    extra: tuple = ()  # ((variant name, in_specs with "*" = every mesh axis), ...)
    int_high: int = 0  # integer arguments drawn in [0, int_high) (0: the first arg's dim 0)
    uneven: bool = True  # a dim-0 uneven variant makes sense
    uneven_args: tuple = (0,)  # the arguments whose dim 0 is the first argument's (made uneven together)


def _maxpool(x):
    from jax import lax
    return lax.reduce_window(x, -np.inf, lax.max, (1, 3), (1, 2), "SAME")


def cases() -> list[Case]:
    import jax
    import jax.numpy as jnp
    from jax import lax

    B, N, K, V, D = 128, 256, 128, 8192, 128
    q = dict(B=16, N=32, K=32, V=256, D=16)

    def s(*dims_dtype):
        return tuple(dims_dtype)

    def both(full, quick):
        return dict(shapes=full, quick_shapes=quick)

    bn = both(s(((B, N), F32)), s(((q["B"], q["N"]), F32)))
    key = jax.random.PRNGKey(0)

    def keys_roundtrip(x):
        keys = jax.random.wrap_key_data(jnp.abs(x[:, :2] * 1000).astype(jnp.uint32))
        keys = jax.vmap(lambda k: jax.random.fold_in(k, 7))(keys)
        return x + jax.random.key_data(keys).astype(x.dtype).sum(axis=1, keepdims=True)

    def ragged(x, w):
        sizes = jnp.full((4,), x.shape[0] // 4, jnp.int32)
        return lax.ragged_dot(x, w, sizes)

    def chol(x):
        a = jnp.einsum("bij,bkj->bik", x, x) + x.shape[-1] * jnp.eye(x.shape[-1], dtype=x.dtype)
        return jnp.linalg.cholesky(a)

    def split2(x):
        a, b = jnp.split(x, 2, axis=1)
        return a * b

    def unstack(x):
        a, b = x[..., 0], x[..., 1]
        return a - b

    return [
        Case("elementwise", "tanh(x)*2+1", lambda x: jnp.tanh(x) * 2 + 1, **bn),
        Case("broadcast_in_dim", "broadcast", lambda x: jnp.broadcast_to(x[:, None, :], (x.shape[0], 8, x.shape[1])) + 1,
             **bn),
        Case("transpose", "x.T", lambda x: jnp.transpose(x) + 1, **bn),
        Case("reshape", "reshape", lambda x: jnp.reshape(x, (x.shape[0], x.shape[1] // 4, 4)) + 1, **bn, uneven=False),
        Case("iota", "x + arange", lambda x: x + jnp.arange(x.shape[1], dtype=x.dtype), **bn),
        Case("dot_general", "x @ w", lambda x, w: x @ w,
             **both(s(((B, K), F32), ((K, N), F32)), s(((q["B"], q["K"]), F32), ((q["K"], q["N"]), F32))),
             extra=(("x{*,-} w{-,*}", ("*", None), (None, "*")), ("x{-,*} w{*,-}", (None, "*"), ("*", None)))),
        Case("reduce", "sum(axis=1)", lambda x: jnp.sum(x, axis=1), **bn),
        Case("argreduce", "argmax(axis=1)", lambda x: jnp.argmax(x, axis=1), **bn),
        Case("scan_along", "cumsum(axis=1)", lambda x: jnp.cumsum(x, axis=1), **bn),
        Case("sort", "sort(axis=1)", lambda x: jnp.sort(x, axis=1), **bn),
        Case("top_k", "top_k(8)", lambda x: lax.top_k(x, 8)[0], **bn),
        # 32 matrices, not 64: jaxlib 0.10.2's CPU LAPACK kernels split a batch of 64 32x32
        # matrices into chunks on XLA:CPU's intra-op pool and block the calling thread until
        # they finish; after a collective the 8 host devices resume on that pool's workers,
        # and when all of them are inside potrf no worker is left to run a chunk: the process
        # deadlocks, jax.jit's program as well as ours (the "dim 2" layout: an all-reduce, then
        # the whole batch on every device). Batches up to 32 never did; jax >= 0.11 has no
        # such parallel path. benchmarks/results/ops.md's notes say more.
        Case("batched", "cholesky", chol,
             **both(s(((32, 32, 32), F32)), s(((8, 8, 8), F32)))),
        Case("generic_reduce", "lax.reduce(a*0.5+b)", lambda x: lax.reduce(x, 0.0, lambda a, b: a * 0.5 + b, (1,)),
             **bn),
        Case("replicated", "optimization_barrier", lambda x: lax.optimization_barrier(x) + 1, **bn),
        Case("key_op", "wrap, fold_in, unwrap keys", keys_roundtrip, **bn),
        Case("ragged_dot_general", "ragged_dot (4 groups)", ragged,
             **both(s(((B, K), F32), ((4, K, N), F32)), s(((q["B"], q["K"]), F32), ((4, q["K"], q["N"]), F32)))),
        Case("rotate", "roll(3, axis=1)", lambda x: jnp.roll(x, 3, axis=1) * 2, **bn),
        Case("concatenate", "concat(axis=1)", lambda x: jnp.concatenate([x, x * 2], axis=1), **bn),
        Case("dynamic_slice", "dynamic_slice", lambda x, i: lax.dynamic_slice_in_dim(x, i[0], 4, axis=1),
             **both(s(((B, N), F32), ((1,), I32)), s(((q["B"], q["N"]), F32), ((1,), I32))), int_high=16),
        Case("dynamic_update_slice", "dynamic_update_slice",
             lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i[0], axis=1),
             **both(s(((B, N), F32), ((B, 4), F32), ((1,), I32)), s(((q["B"], q["N"]), F32), ((q["B"], 4), F32), ((1,), I32))),
             int_high=16, uneven_args=(0, 1)),
        Case("pad", "pad", lambda x: jnp.pad(x, ((1, 2), (3, 0))), **bn),
        Case("rev", "flip(axis=1)", lambda x: jnp.flip(x, axis=1) + 1, **bn),
        Case("slice_", "x[:, 2:-3]", lambda x: x[:, 2:-3] + 1, **bn),
        Case("split", "split(2, axis=1)", split2, **bn),
        Case("stack", "stack", lambda x: jnp.stack([x, x + 1], axis=1), **bn),
        Case("tile", "tile", lambda x: jnp.tile(x, (1, 2)), **bn),
        Case("unstack", "x[..., 0] - x[..., 1]", unstack,
             **both(s(((B, N, 2), F32)), s(((q["B"], q["N"], 2), F32)))),
        Case("gather", "embedding take(table, ids)", lambda t, i: jnp.take(t, i, axis=0),
             **both(s(((V, D), F32), ((32, 64), I32)), s(((q["V"], q["D"]), F32), ((4, 8), I32))),
             extra=(("table{*,-} ids{*,-}", ("*", None), ("*", None)),)),
        Case("gather", "take_along_axis(axis=1)", lambda x, i: jnp.take_along_axis(x, i, axis=1),
             **both(s(((B, N), F32), ((B, 16), I32)), s(((q["B"], q["N"]), F32), ((q["B"], 4), I32))),
             int_high=16, uneven_args=(0, 1)),
        Case("scatter", "table.at[ids].add(u)", lambda t, i, u: t.at[i].add(u),
             **both(s(((V, D), F32), ((2048,), I32), ((2048, D), F32)),
                    s(((q["V"], q["D"]), F32), ((64,), I32), ((64, q["D"]), F32))),
             extra=(("table{*,-} ids{*} u{*,-}", ("*", None), ("*",), ("*", None)),)),
        Case("random_bits", "x * uniform(key)", lambda x: x * jax.random.uniform(key, x.shape), **bn),
        Case("key_split", "per-row keys: split(key, rows)",
             lambda x: x + jax.random.split(key, x.shape[0])[:, :1].astype(x.dtype), **bn),
        Case("conv", "conv1d k=3", lambda x, w: lax.conv_general_dilated(x, w, (1,), "SAME",
                                                                       dimension_numbers=("NWC", "WIO", "NWC")),
             **both(s(((32, 128, 64), F32), ((3, 64, 64), F32)), s(((4, 16, 8), F32), ((3, 8, 8), F32)))),
        Case("reduce_window", "max pool 3/2", _maxpool, **bn),
        Case("select_and_scatter_add", "max pool gradient", jax.grad(lambda x: _maxpool(x).sum()), **bn),
        Case("select_and_gather_add", "max pool jvp", lambda x: jax.jvp(_maxpool, (x,), (x * 0.5,))[1], **bn),
        Case("control", "fori_loop(4, tanh)", lambda x: lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c) + 0.5, x), **bn),
    ]


#: families with no case, and why (every other rule function has one)
NOT_RACED = {
    "debug_callback": "a host callback (runs on the host, not an op to race)",
    "pure_callback": "a host callback (runs on the host, not an op to race)",
    "no_operands": "empty / platform_index: no operands to shard",
    "dce_sink": "dce_sink keeps a value alive for JAX's dead-code elimination: no result to race",
    "manual": "a user's jax.shard_map region: its body is the user's own per-device program, run as written",
}


def _resolve(spec, axes: Sequence[str]):
    import gspmd_py as gp

    if spec is None:
        return None
    every = tuple(axes) if len(axes) > 1 else axes[0]
    return gp.P(*[every if e == "*" else e for e in spec])


def variants(case: Case, mesh, quick: bool, all_layouts: bool = False) -> list[tuple[str, tuple, list]]:
    """(variant name, in_specs, args) for ``case`` on ``mesh`` (``quick``: small shapes and the
    batch layout alone, unless ``all_layouts``)."""
    import gspmd_py as gp

    axes = tuple(mesh.axis_names)
    every = axes if len(axes) > 1 else axes[0]
    shapes = case.quick_shapes if quick and case.quick_shapes else case.shapes
    rank = len(shapes[0][0])
    rest = (None,) * (len(shapes) - 1)
    out = [("replicated", (None,) + rest, shapes)]
    for d in range(rank):
        spec = gp.P(*[every if i == d else None for i in range(rank)])
        out.append(("batch" if d == 0 else f"dim {d}", (spec,) + rest, shapes))
    if case.uneven:
        k = int(np.prod(mesh.shape))
        first = (shapes[0][0][0] // k) * k + 1 if shapes[0][0][0] > k else k + 1
        uneven = tuple(((first,) + tuple(shp[1:]), dt) if i in case.uneven_args else (shp, dt)
                       for i, (shp, dt) in enumerate(shapes))
        out.append((f"uneven (dim 0 = {first})", (gp.P(*([every] + [None] * (rank - 1))),) + rest, uneven))
    for name, *specs in case.extra:
        out.append((name, tuple(_resolve(sp, axes) for sp in specs), shapes))
    if quick and not all_layouts:  # the batch layout only
        out = [out[1]]
    return [(n, specs, make_args(case, shp)) for n, specs, shp in out]


def make_args(case: Case, shapes) -> list:
    rng = np.random.default_rng(0)
    out = []
    high = case.int_high or shapes[0][0][0]
    for shape, dt in shapes:
        if np.issubdtype(dt, np.integer):
            out.append(rng.integers(0, high, size=shape).astype(dt))
        else:
            out.append(rng.standard_normal(shape).astype(dt))
    return out


def missing_families(registered: Sequence[str], covered: Optional[Sequence[str]] = None) -> list[str]:
    """Rule functions with neither a case nor a reason in NOT_RACED."""
    have = set(covered if covered is not None else (c.family for c in cases())) | set(NOT_RACED)
    return sorted(set(registered) - have)
