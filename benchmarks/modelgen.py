"""Model architectures drawn from a seed (issue 37 item 5): a held-out protocol nobody tunes to.

``generate(seed, size)`` -> ``Model``: a training step (loss -> jax.value_and_grad -> SGD or Adam,
returning the new params (and optimizer state) and the loss) composed of blocks drawn at random
(numpy Generator, deterministic: the same seed gives the same model):

* inputs: token embedding (gather), an input projection of features, or a 2-D convolution stem
  over an NHWC image;
* blocks: attention (MHA, or GQA with 1-2 KV heads: fewer than any tensor-parallel degree;
  no mask, causal or sliding-window), MLP (GELU, or gated SwiGLU), mixture of experts (top-k
  dispatch by dense one-hot gates, or ragged: top-1 tokens sorted and ``lax.ragged_dot``),
  1-D convolution along the sequence, a recurrence (``lax.scan`` over time), a segment pooling
  (``jax.ops.segment_sum`` scatter-add and a gather back), a conditioning path (FiLM from an
  extra input, ``jnp.split`` of one projection); layer or RMS norms;
* optionally a stack of identical blocks as ``lax.scan`` over stacked layer weights;
* heads: an output projection to a vocabulary (cross entropy; tied to the embedding where the
  input is one), a regression projection (MSE), or a mean-pooled classifier.

Every parameter leaf has a *role* (``Model.roles``: path -> ``Role``): what a practitioner
shards it by (column / row of a Megatron pair, vocabulary, experts, replicated small vectors),
and how many leading stacked-layer dims it has. ``benchmarks/modelgen_plans.py`` builds the
hand plans from the roles, whatever the model. Sizes: "tiny" (tests: a few ms a step
unpartitioned) and "bench" (drawn; well under a second a step on 8 CPU devices); every dim
the plans split divides by 8.

    >>> m = generate(3, "tiny")
    >>> m.name, sorted(m.roles)[:2] == sorted(generate(3, "tiny").roles)[:2]
    ('gen3', True)
"""
from __future__ import annotations

from typing import Callable

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32 = jnp.float32


@attrs.frozen
class Role:
    """How a practitioner shards a parameter: ``kind`` one of "col" ([.., in, out]: out split
    under tensor parallelism), "row" ([.., in, out]: in split), "vocab_rows" (an embedding
    [v, d]), "vocab_cols" (an output projection [d, v]), "expert_col" / "expert_row" ([.., e,
    in, out]: e split by expert parallelism, out / in by tensor parallelism), "kv" (a GQA key
    or value projection: column-split only when its heads divide the degree), "rep" (norms,
    biases, routers, convolution kernels, recurrences: replicated); ``lead``: stacked-layer
    dims in front; ``heads``: the KV heads of a "kv" weight."""

    kind: str
    lead: int = 0
    heads: int = 0


@attrs.frozen
class Model:
    """A generated training step. ``args``: (params, [opt,] data...); ``params``/``data``: the
    argument numbers of parameters (and optimizer state) and of batch data; ``seq_data``: the
    data arguments with a sequence dim 1 that a sequence-parallel plan may split;
    ``blocks``: the drawn structure, in words."""

    name: str
    fn: Callable = attrs.field(eq=False, repr=False)
    args: tuple = attrs.field(eq=False, repr=False)
    roles: dict = attrs.field(eq=False, repr=False)
    params: tuple[int, ...]
    data: tuple[int, ...]
    seq_data: tuple[int, ...]
    blocks: tuple[str, ...]
    has_experts: bool
    sequence_ok: bool
    optimizer: str

    @property
    def title(self) -> str:
        return f"{self.name}: {' > '.join(self.blocks)} ({self.optimizer})"


class _Bank:
    """Parameters and their roles, built in drawing order."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.params, self.roles = rng, {}, {}

    def w(self, path: str, shape: tuple, role: Role, scale: float | None = None, init: str = "normal"):
        if init == "ones":
            a = np.ones(shape, np.float32)
        elif init == "zeros":
            a = np.zeros(shape, np.float32)
        else:
            fan_in = shape[-2] if len(shape) >= 2 else shape[-1]
            a = self.rng.standard_normal(shape).astype(np.float32) * (scale if scale is not None else fan_in ** -0.5)
        node = self.params
        keys = path.split("/")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = jnp.asarray(a)
        self.roles[path] = role
        return path


def _get(p: dict, path: str):
    for k in path.split("/"):
        p = p[k]
    return p


# -- blocks: each ``make(bank, prefix, dims, rng, lead)`` returns ``apply(p, h, ctx) -> h`` ---------
def _norm(kind: str, x, g, b=None):
    if kind == "rms":
        return x * lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _norm_params(bank: _Bank, pre: str, d: int, kind: str, lead: tuple):
    bank.w(f"{pre}/g", lead + (d,), Role("rep", len(lead)), init="ones")
    if kind == "layer":
        bank.w(f"{pre}/b", lead + (d,), Role("rep", len(lead)), init="zeros")


def _apply_norm(p, pre, kind, x):
    return _norm(kind, x, _get(p, f"{pre}/g"), _get(p, f"{pre}/b") if kind == "layer" else None)


def _attention(bank, pre, dims, rng, lead):
    d, heads = dims["d"], dims["heads"]
    hd = d // heads
    kv = heads if rng.random() < 0.5 else int(rng.choice([1, 2]))
    mask = str(rng.choice(["none", "causal", "sliding"]))
    window = max(2, dims["t"] // 4)
    L = len(lead)
    bank.w(f"{pre}/wq", lead + (d, d), Role("col", L))
    kv_role = Role("col", L) if kv == heads else Role("kv", L, kv)
    bank.w(f"{pre}/wk", lead + (d, kv * hd), kv_role)
    bank.w(f"{pre}/wv", lead + (d, kv * hd), kv_role)
    bank.w(f"{pre}/wo", lead + (d, d), Role("row", L))

    def apply(p, x, ctx):
        b, t, _ = x.shape
        q = (x @ _get(p, f"{pre}/wq")).reshape(b, t, heads, hd)
        k = (x @ _get(p, f"{pre}/wk")).reshape(b, t, kv, hd)
        v = (x @ _get(p, f"{pre}/wv")).reshape(b, t, kv, hd)
        if kv != heads:
            k, v = jnp.repeat(k, heads // kv, axis=2), jnp.repeat(v, heads // kv, axis=2)
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * hd ** -0.5
        if mask != "none":
            i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
            keep = (j <= i) if mask == "causal" else ((j <= i) & (i - j < window))
            s = jnp.where(keep, s, -1e9)
        o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), v).reshape(b, t, d)
        return o @ _get(p, f"{pre}/wo")

    return apply, f"attn({'MHA' if kv == heads else f'GQA kv={kv}'}, {mask})"


def _mlp(bank, pre, dims, rng, lead):
    d, f = dims["d"], dims["f"]
    gated = rng.random() < 0.5
    L = len(lead)
    bank.w(f"{pre}/w1", lead + (d, f), Role("col", L))
    if gated:
        bank.w(f"{pre}/w3", lead + (d, f), Role("col", L))
    bank.w(f"{pre}/w2", lead + (f, d), Role("row", L))

    def apply(p, x, ctx):
        h = x @ _get(p, f"{pre}/w1")
        h = jax.nn.silu(h) * (x @ _get(p, f"{pre}/w3")) if gated else jax.nn.gelu(h)
        return h @ _get(p, f"{pre}/w2")

    return apply, "mlp(SwiGLU)" if gated else "mlp(GELU)"


def _moe(bank, pre, dims, rng, lead):
    d, f, e = dims["d"], dims["f"] // 2, 8
    ragged = not lead and rng.random() < 0.4
    k = 1 if ragged else int(rng.choice([1, 2]))
    L = len(lead)
    bank.w(f"{pre}/router", lead + (d, e), Role("rep", L))
    bank.w(f"{pre}/wi", lead + (e, d, f), Role("expert_col", L))
    bank.w(f"{pre}/wo", lead + (e, f, d), Role("expert_row", L))

    def dense(p, x, ctx):
        gates = jax.nn.softmax(x @ _get(p, f"{pre}/router"), axis=-1)
        top_g, top_i = lax.top_k(gates, k)
        weight = (jax.nn.one_hot(top_i, e, dtype=F32) * top_g[..., None]).sum(-2)  # [b, t, e]
        h = jax.nn.gelu(jnp.einsum("btd,edf->btef", x, _get(p, f"{pre}/wi")))
        return jnp.einsum("btef,efd,bte->btd", h, _get(p, f"{pre}/wo"), weight)

    def sparse(p, x, ctx):
        b, t, _ = x.shape
        flat = x.reshape(b * t, d)
        gates = jax.nn.softmax(flat @ _get(p, f"{pre}/router"), axis=-1)
        idx = jnp.argmax(gates, axis=-1)
        order = jnp.argsort(idx)
        sizes = jnp.bincount(idx, length=e).astype(jnp.int32)
        h = jax.nn.gelu(lax.ragged_dot(flat[order], _get(p, f"{pre}/wi"), sizes))
        out = lax.ragged_dot(h, _get(p, f"{pre}/wo"), sizes)
        back = jnp.zeros_like(out).at[order].set(out)
        return (back * jnp.max(gates, axis=-1, keepdims=True)).reshape(b, t, d)

    return (sparse if ragged else dense), f"moe({'ragged top-1' if ragged else f'top-{k}'})"


def _conv1d(bank, pre, dims, rng, lead):
    d, width = dims["d"], int(rng.choice([3, 5]))
    bank.w(f"{pre}/kernel", lead + (width, d, d), Role("rep", len(lead)), scale=(width * d) ** -0.5)

    def apply(p, x, ctx):
        y = lax.conv_general_dilated(x, _get(p, f"{pre}/kernel"), (1,), "SAME",
                                     dimension_numbers=("NWC", "WIO", "NWC"))
        return jax.nn.gelu(y)

    return apply, f"conv1d(k={width})"


def _recurrence(bank, pre, dims, rng, lead):
    d = dims["d"]
    L = len(lead)
    bank.w(f"{pre}/wx", lead + (d, d), Role("rep", L))
    bank.w(f"{pre}/wh", lead + (d, d), Role("rep", L), scale=0.5 * d ** -0.5)

    def apply(p, x, ctx):
        xs = jnp.swapaxes(x @ _get(p, f"{pre}/wx"), 0, 1)  # [t, b, d]
        wh = _get(p, f"{pre}/wh")

        def step(h, xt):
            h = jnp.tanh(xt + h @ wh)
            return h, h

        _, hs = lax.scan(step, jnp.zeros_like(xs[0]), xs)
        return jnp.swapaxes(hs, 0, 1)

    return apply, "rnn(lax.scan over time)"


def _segment(bank, pre, dims, rng, lead):
    d, nseg = dims["d"], dims["segments"]
    bank.w(f"{pre}/w", lead + (d, d), Role("rep", len(lead)))

    def apply(p, x, ctx):
        b, t, _ = x.shape
        ids = (ctx["segments"] + jnp.arange(b, dtype=jnp.int32)[:, None] * nseg).reshape(b * t)
        flat = x.reshape(b * t, d)
        sums = jax.ops.segment_sum(flat, ids, num_segments=b * nseg)
        counts = jax.ops.segment_sum(jnp.ones((b * t, 1), F32), ids, num_segments=b * nseg)
        pooled = (sums / jnp.maximum(counts, 1.0))[ids].reshape(b, t, d)
        return pooled @ _get(p, f"{pre}/w")

    return apply, "segment pool(segment_sum, gather)"


def _film(bank, pre, dims, rng, lead):
    d, dc = dims["d"], dims["cond"]
    bank.w(f"{pre}/wc", lead + (dc, 2 * d), Role("rep", len(lead)))

    def apply(p, x, ctx):
        scale, shift = jnp.split(ctx["cond"] @ _get(p, f"{pre}/wc"), 2, axis=-1)
        return x * scale[:, None, :] + shift[:, None, :]

    return apply, "FiLM(cond, split)"


_MIXERS = {"attention": _attention, "conv1d": _conv1d, "recurrence": _recurrence, "segment": _segment}
_FFNS = {"mlp": _mlp, "moe": _moe}


def _draw_sublayers(rng, dims, allow) -> list:
    """One residual block: a token mixer then a feed-forward (names), maybe a conditioning path."""
    mixers = [m for m in ("attention", "attention", "conv1d", "recurrence", "segment") if m in allow]
    out = [str(rng.choice(mixers)), str(rng.choice(["mlp", "mlp", "moe"]))]
    if "film" in allow and rng.random() < 0.5:
        out.insert(1, "film")
    return out


def _residual_block(bank, pre, dims, rng, lead, kinds, norm):
    """Pre-norm residual sublayers; returns (apply, words)."""
    parts, words = [], []
    for i, kind in enumerate(kinds):
        make = _MIXERS.get(kind) or _FFNS.get(kind) or _film
        npre = f"{pre}/n{i}"
        _norm_params(bank, npre, dims["d"], norm, lead)
        fn, w = make(bank, f"{pre}/{kind}{i}", dims, rng, lead)
        parts.append((npre, fn, kind == "film"))
        words.append(w)

    def apply(p, h, ctx):
        for npre, fn, film in parts:
            h = fn(p, h, ctx) if film else h + fn(p, _apply_norm(p, npre, norm, h), ctx)
        return h

    return apply, " + ".join(words)


# -- the model ---------------------------------------------------------------------------------------
def _dims(rng: np.random.Generator, size: str) -> dict:
    if size == "tiny":
        return dict(b=8, t=8, d=32, f=64, heads=8, vocab=64, feat=16, cond=8, segments=2, img=8, chans=3)
    d = int(rng.choice([64, 128, 256]))
    return dict(b=int(rng.choice([8, 16])), t=int(rng.choice([32, 64])), d=d, f=int(rng.choice([2, 4])) * d,
                heads=int(rng.choice([4, 8])), vocab=int(rng.choice([512, 1024, 2048])), feat=int(rng.choice([32, 64])),
                cond=32, segments=4, img=16, chans=int(rng.choice([3, 8])))


def _image_rows(t: int) -> int:
    """Rows of 2x2 patches of an image of ``t`` patches (a power of two): as square as it gets."""
    return 2 ** (int(np.log2(t)) // 2)


def generate(seed: int, size: str = "bench") -> Model:
    """The model of ``seed`` at ``size`` ("tiny" or "bench"): the same structure at both sizes."""
    rng = np.random.default_rng(seed)
    structure = np.random.default_rng(rng.integers(2**31))  # draws the architecture
    sizes = np.random.default_rng(rng.integers(2**31))      # draws the dims (bench only)
    dims = _dims(sizes, size)
    if size == "tiny":
        dims["heads"] = int(sizes.choice([4, 8]))
    bank = _Bank(np.random.default_rng(seed + 7919))
    b, t, d = dims["b"], dims["t"], dims["d"]
    norm = str(structure.choice(["layer", "rms"]))
    stem = str(structure.choice(["tokens", "features", "image"]))
    head = str(structure.choice(["lm", "regress", "classify"]))
    if stem == "tokens" and head == "lm" and structure.random() < 0.5:
        head = "tied"
    optimizer = str(structure.choice(["sgd", "adam"]))
    n_blocks = int(structure.integers(1, 3))
    scanned = structure.random() < 0.35
    allow = {"attention", "conv1d", "recurrence", "segment", "film"}
    block_kinds = [_draw_sublayers(structure, dims, allow) for _ in range(n_blocks)]
    scan_kinds = _draw_sublayers(structure, dims, allow - {"recurrence", "segment", "film"}) if scanned else None
    layers = int(structure.choice([2, 4])) if scanned else 0
    words = []

    # stem
    if stem == "tokens":
        bank.w("embed", (dims["vocab"], d), Role("vocab_rows"), scale=0.02)
        words.append("embedding")
    elif stem == "features":
        bank.w("in_proj", (dims["feat"], d), Role("rep"))
        words.append("input projection")
    else:
        patch = 2
        bank.w("stem", (3, 3, dims["chans"], d // (patch * patch)), Role("rep"), scale=(9 * dims["chans"]) ** -0.5)
        words.append("conv2d stem")
    blocks = []
    for i, kinds in enumerate(block_kinds):
        fn, w = _residual_block(bank, f"block{i}", dims, structure, (), kinds, norm)
        blocks.append(fn)
        words.append(w)
    scan_fn = None
    if scanned:
        scan_fn, w = _residual_block(bank, "stack", dims, structure, (layers,), scan_kinds, norm)
        words.append(f"scan x{layers}[{w}]")
    _norm_params(bank, "final_norm", d, norm, ())
    if head == "lm":
        bank.w("out_proj", (d, dims["vocab"]), Role("vocab_cols"))
    elif head == "regress":
        bank.w("out_proj", (d, dims["feat"]), Role("rep"))
    elif head == "classify":
        bank.w("out_proj", (d, 16), Role("rep"))
    words.append({"lm": "LM head", "tied": "tied LM head", "regress": "regression head", "classify": "pooled classifier"}[head])
    uses = {k for kinds in block_kinds for k in kinds} | set(scan_kinds or ())
    params = bank.params

    data_rng = np.random.default_rng(seed + 104729)
    data = {}
    if stem == "tokens":
        data["x"] = jnp.asarray(data_rng.integers(0, dims["vocab"], (b, t)), jnp.int32)
    elif stem == "features":
        data["x"] = jnp.asarray(data_rng.standard_normal((b, t, dims["feat"])).astype(np.float32))
    else:
        rows = _image_rows(t)
        data["x"] = jnp.asarray(data_rng.standard_normal((b, 2 * rows, 2 * (t // rows), dims["chans"])).astype(np.float32))
    if "segment" in uses:
        data["segments"] = jnp.asarray(np.sort(data_rng.integers(0, dims["segments"], (b, t)), axis=1), jnp.int32)
    if "film" in uses:
        data["cond"] = jnp.asarray(data_rng.standard_normal((b, dims["cond"])).astype(np.float32))
    if head in ("lm", "tied"):
        data["y"] = jnp.asarray(data_rng.integers(0, dims["vocab"], (b, t)), jnp.int32)
    elif head == "regress":
        data["y"] = jnp.asarray(data_rng.standard_normal((b, t, dims["feat"])).astype(np.float32))
    else:
        data["y"] = jnp.asarray(data_rng.integers(0, 16, (b,)), jnp.int32)
    names = tuple(data)

    def loss(p, *xs):
        ctx = dict(zip(names, xs))
        x = ctx["x"]
        if stem == "tokens":
            h = jnp.take(p["embed"], x, axis=0)
        elif stem == "features":
            h = x @ p["in_proj"]
        else:
            y = jax.nn.gelu(lax.conv_general_dilated(x, p["stem"], (1, 1), "SAME",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC")))
            bb, hh, ww, cc = y.shape
            h = y.reshape(bb, hh // 2, 2, ww // 2, 2, cc).transpose(0, 1, 3, 2, 4, 5).reshape(bb, t, d)
        for fn in blocks:
            h = fn(p, h, ctx)
        if scan_fn is not None:
            h, _ = lax.scan(lambda c, lp: (scan_fn({"stack": lp}, c, ctx), None), h, p["stack"])
        h = _apply_norm(p, "final_norm", norm, h)
        if head in ("lm", "tied"):
            logits = h @ (p["embed"].T if head == "tied" else p["out_proj"])
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.take_along_axis(logp, ctx["y"][..., None], axis=-1).mean()
        if head == "regress":
            return ((h @ p["out_proj"] - ctx["y"]) ** 2).mean()
        logp = jax.nn.log_softmax(h.mean(axis=1) @ p["out_proj"], axis=-1)
        return -jnp.take_along_axis(logp, ctx["y"][:, None], axis=-1).mean()

    if optimizer == "sgd":
        def step(p, *xs):
            val, g = jax.value_and_grad(loss)(p, *xs)
            return jax.tree.map(lambda a, da: a - 1e-2 * da, p, g), val

        args = (params,) + tuple(data.values())
        par = (0,)
    else:
        def step(p, opt, *xs):
            val, g = jax.value_and_grad(loss)(p, *xs)
            m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], g)
            v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], g)
            new = jax.tree.map(lambda a, m, v: a - 1e-3 * m / (jnp.sqrt(v) + 1e-8), p, m, v)
            return new, {"m": m, "v": v}, val

        opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params)}
        args = (params, opt) + tuple(data.values())
        par = (0, 1)
    first = len(par)
    data_idx = tuple(range(first, first + len(names)))
    seq = tuple(first + i for i, n in enumerate(names) if n in ("x", "y", "segments") and args[first + i].ndim >= 2
                and stem != "image")
    sequence_ok = stem != "image" and not ({"recurrence", "segment"} & uses) and head != "classify"
    return Model(name=f"gen{seed}", fn=step, args=args, roles=dict(bank.roles), params=par, data=data_idx,
                 seq_data=seq, blocks=tuple(words), has_experts="moe" in uses, sequence_ok=sequence_ok,
                 optimizer=optimizer)
