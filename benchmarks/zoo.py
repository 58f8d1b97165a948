"""The held-out model zoo (issue 28): eight training steps as users write them, and the plans an
expert writes for them by hand.

Each model is ``make(size) -> (fn, args, info)``: ``size`` "tiny" (tests: well under a second)
or "bench" (one step a few to tens of ms on 8 CPU devices with a good plan). ``fn`` is an
ordinary JAX training step (loss -> jax.value_and_grad -> SGD or Adam update) returning the new
params (and optimizer state) and the loss; params are dicts. ``info``: ``title``, ``params``
(argument numbers of params and optimizer state), ``data`` (argument numbers of batch data),
and ``memory_limit`` (bytes per device) where the model has one.

``hand_plans(name, mesh, args, info)`` -> {plan name: gp.spmd keyword arguments} for the
meshes (2, 4) ("x", "y") and (8,) ("x",): replicated, data parallel, FSDP / ZeRO-3, Megatron,
data parallel + Megatron, 2D, expert parallel, spatial, column-sharded tables, where they apply.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

P = gp.P
F32 = jnp.float32


# -- shared pieces ----------------------------------------------------------------------------
def _rng(seed: int):
    return np.random.default_rng(seed)


def _w(rng, *shape, scale=None):
    scale = scale if scale is not None else 1.0 / np.sqrt(shape[-2] if len(shape) > 1 else shape[-1])
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * scale)


def _sgd(params, grads, lr=1e-2):
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def _adam(params, opt, grads, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
    new = jax.tree.map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + eps), params, m, v)
    return new, {"m": m, "v": v}


def _layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _rms_norm(x, g):
    return x * lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g


def _xent(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1).mean()


def _mha(x, p, heads, causal):
    b, t, d = x.shape
    k = d // heads
    q = (x @ p["wq"]).reshape(b, t, heads, k)
    kk = (x @ p["wk"]).reshape(b, t, heads, k)
    v = (x @ p["wv"]).reshape(b, t, heads, k)
    s = jnp.einsum("bqhk,bshk->bhqs", q, kk) * k ** -0.5
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), v).reshape(b, t, d)
    return o @ p["wo"]


def _block_params(rng, d, f):
    return {"ln1_g": jnp.ones((d,), F32), "ln1_b": jnp.zeros((d,), F32), "wq": _w(rng, d, d), "wk": _w(rng, d, d),
            "wv": _w(rng, d, d), "wo": _w(rng, d, d), "ln2_g": jnp.ones((d,), F32), "ln2_b": jnp.zeros((d,), F32),
            "w1": _w(rng, d, f), "w2": _w(rng, f, d)}


def _block(h, p, heads, causal):
    h = h + _mha(_layer_norm(h, p["ln1_g"], p["ln1_b"]), p, heads, causal)
    return h + jax.nn.gelu(_layer_norm(h, p["ln2_g"], p["ln2_b"]) @ p["w1"]) @ p["w2"]


# -- 1. GPT-2-like LM, tied embeddings ----------------------------------------------------------
def gpt2(size: str):
    b, t, d, f, v, heads = (8, 8, 32, 64, 64, 8) if size == "tiny" else (16, 64, 128, 512, 2048, 8)
    rng = _rng(1)
    params = {"wte": _w(rng, v, d, scale=0.02), "wpe": _w(rng, t, d, scale=0.02),
              "blocks": [_block_params(rng, d, f) for _ in range(2)],
              "lnf_g": jnp.ones((d,), F32), "lnf_b": jnp.zeros((d,), F32)}
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    targets = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)

    def loss(p, tokens, targets):
        h = jnp.take(p["wte"], tokens, axis=0) + p["wpe"][None]
        for bp in p["blocks"]:
            h = _block(h, bp, heads, True)
        h = _layer_norm(h, p["lnf_g"], p["lnf_b"])
        return _xent(h @ p["wte"].T, targets)

    def step(p, tokens, targets):
        l, g = jax.value_and_grad(loss)(p, tokens, targets)
        return _sgd(p, g), l

    return step, (params, tokens, targets), {"title": "GPT-2-like LM (tied embeddings)", "params": (0,),
                                             "data": (1, 2)}


# -- 2. T5-like encoder-decoder layer ----------------------------------------------------------
def _t5_attn(xq, xkv, p, causal):
    q = jnp.einsum("btd,dhk->bthk", xq, p["wq"])
    k = jnp.einsum("bsd,dhk->bshk", xkv, p["wk"])
    v = jnp.einsum("bsd,dhk->bshk", xkv, p["wv"])
    s = jnp.einsum("bthk,bshk->bhts", q, k)
    if causal:
        t = xq.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    o = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("bthk,hkd->btd", o, p["wo"])


def _t5_attn_params(rng, d, h, k):
    return {"wq": _w(rng, d, h, k, scale=d ** -0.5), "wk": _w(rng, d, h, k, scale=d ** -0.5),
            "wv": _w(rng, d, h, k, scale=d ** -0.5), "wo": _w(rng, h, k, d, scale=(h * k) ** -0.5)}


def t5(size: str):
    b, s, t, d, h, k, f = (8, 8, 8, 32, 8, 4, 64) if size == "tiny" else (16, 64, 64, 128, 8, 16, 512)
    rng = _rng(2)
    ffn = lambda: {"wi": _w(rng, d, f), "wo": _w(rng, f, d)}
    params = {"enc": {"ln1": jnp.ones((d,), F32), "attn": _t5_attn_params(rng, d, h, k),
                      "ln2": jnp.ones((d,), F32), "ffn": ffn()},
              "dec": {"ln1": jnp.ones((d,), F32), "self": _t5_attn_params(rng, d, h, k),
                      "ln2": jnp.ones((d,), F32), "cross": _t5_attn_params(rng, d, h, k),
                      "ln3": jnp.ones((d,), F32), "ffn": ffn()}}
    src = _w(rng, b, s, d, scale=1.0)
    tgt_in = _w(rng, b, t, d, scale=1.0)
    tgt = _w(rng, b, t, d, scale=1.0)

    def ff(x, p):
        return jax.nn.relu(x @ p["wi"]) @ p["wo"]

    def loss(p, src, tgt_in, tgt):
        e, dd = p["enc"], p["dec"]
        x = src + _t5_attn(_rms_norm(src, e["ln1"]), _rms_norm(src, e["ln1"]), e["attn"], False)
        x = x + ff(_rms_norm(x, e["ln2"]), e["ffn"])
        y = tgt_in + _t5_attn(_rms_norm(tgt_in, dd["ln1"]), _rms_norm(tgt_in, dd["ln1"]), dd["self"], True)
        y = y + _t5_attn(_rms_norm(y, dd["ln2"]), x, dd["cross"], False)
        y = y + ff(_rms_norm(y, dd["ln3"]), dd["ffn"])
        return ((y - tgt) ** 2).mean()

    def step(p, src, tgt_in, tgt):
        l, g = jax.value_and_grad(loss)(p, src, tgt_in, tgt)
        return _sgd(p, g), l

    return step, (params, src, tgt_in, tgt), {"title": "T5-like encoder-decoder layer", "params": (0,),
                                              "data": (1, 2, 3)}


# -- 3. ViT ----------------------------------------------------------------------------------------
def vit(size: str):
    b, img, patch, c, d, f, heads, ncls = ((8, 8, 4, 3, 32, 64, 8, 16) if size == "tiny"
                                           else (32, 32, 4, 3, 128, 512, 8, 128))
    n = (img // patch) ** 2
    rng = _rng(3)
    params = {"patch_w": _w(rng, patch * patch * c, d), "patch_b": jnp.zeros((d,), F32), "pos": _w(rng, n, d, scale=0.02),
              "blocks": [_block_params(rng, d, f) for _ in range(2)], "ln_g": jnp.ones((d,), F32),
              "ln_b": jnp.zeros((d,), F32), "head": _w(rng, d, ncls)}
    images = _w(rng, b, img, img, c, scale=1.0)
    labels = jnp.asarray(rng.integers(0, ncls, (b,)), jnp.int32)

    def loss(p, images, labels):
        g = img // patch
        x = images.reshape(b, g, patch, g, patch, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, n, patch * patch * c)
        h = x @ p["patch_w"] + p["patch_b"] + p["pos"][None]
        for bp in p["blocks"]:
            h = _block(h, bp, heads, False)
        h = _layer_norm(h, p["ln_g"], p["ln_b"]).mean(axis=1)
        return _xent(h @ p["head"], labels)

    def step(p, images, labels):
        l, g = jax.value_and_grad(loss)(p, images, labels)
        return _sgd(p, g), l

    return step, (params, images, labels), {"title": "ViT (2 blocks, mean pool)", "params": (0,), "data": (1, 2)}


# -- 4. top-2 MoE layer (GShard) ------------------------------------------------------------------
def moe(size: str):
    g, s, m, e, hdim = (8, 16, 16, 8, 32) if size == "tiny" else (8, 256, 128, 8, 512)
    cap = 2 * s // e  # capacity factor 1 for top-2
    rng = _rng(4)
    params = {"router": _w(rng, m, e), "wi": _w(rng, e, m, hdim), "wo": _w(rng, e, hdim, m)}
    x = _w(rng, g, s, m, scale=1.0)
    tgt = _w(rng, g, s, m, scale=1.0)

    def loss(p, x, tgt):
        gates = jax.nn.softmax(jnp.einsum("gsm,me->gse", x, p["router"]), axis=-1)
        top_g, top_i = lax.top_k(gates, 2)
        mask1 = jax.nn.one_hot(top_i[..., 0], e, dtype=F32)
        mask2 = jax.nn.one_hot(top_i[..., 1], e, dtype=F32)
        pos1 = jnp.cumsum(mask1, axis=1) - mask1
        pos2 = jnp.cumsum(mask2, axis=1) - mask2 + mask1.sum(axis=1, keepdims=True)
        mask1 = mask1 * (pos1 < cap)
        mask2 = mask2 * (pos2 < cap)
        p1 = jax.nn.one_hot((pos1 * mask1).sum(-1).astype(jnp.int32), cap, dtype=F32)
        p2 = jax.nn.one_hot((pos2 * mask2).sum(-1).astype(jnp.int32), cap, dtype=F32)
        combine = (top_g[..., 0, None, None] * mask1[..., None] * p1[:, :, None, :]
                   + top_g[..., 1, None, None] * mask2[..., None] * p2[:, :, None, :])  # [g, s, e, c]
        dispatch = (combine > 0).astype(F32)
        xin = jnp.einsum("gsec,gsm->egcm", dispatch, x)
        h = jax.nn.relu(jnp.einsum("egcm,emh->egch", xin, p["wi"]))
        out = jnp.einsum("egch,ehm->egcm", h, p["wo"])
        y = jnp.einsum("gsec,egcm->gsm", combine, out)
        aux = (gates.mean(axis=1) * mask1.mean(axis=1)).mean() * e * e
        return ((y - tgt) ** 2).mean() + 0.01 * aux

    def step(p, x, tgt):
        l, g_ = jax.value_and_grad(loss)(p, x, tgt)
        return _sgd(p, g_), l

    return step, (params, x, tgt), {"title": "top-2 MoE layer (GShard)", "params": (0,), "data": (1, 2)}


# -- 5. U-Net -----------------------------------------------------------------------------------------
def _conv(x, w, stride=1):
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def unet(size: str):
    b, hw, c, c1 = (8, 16, 2, 4) if size == "tiny" else (8, 64, 4, 16)
    rng = _rng(5)
    cw = lambda k, i, o: _w(rng, k, k, i, o, scale=(k * k * i) ** -0.5)
    params = {"e1": cw(3, c, c1), "d1": cw(3, c1, 2 * c1), "d2": cw(3, 2 * c1, 4 * c1),
              "u2": cw(3, 4 * c1 + 2 * c1, 2 * c1), "u1": cw(3, 2 * c1 + c1, c1), "out": cw(1, c1, c)}
    x = _w(rng, b, hw, hw, c, scale=1.0)
    tgt = _w(rng, b, hw, hw, c, scale=1.0)

    def up(x):
        return jnp.repeat(jnp.repeat(x, 2, axis=1), 2, axis=2)

    def loss(p, x, tgt):
        h1 = jax.nn.relu(_conv(x, p["e1"]))
        h2 = jax.nn.relu(_conv(h1, p["d1"], 2))
        h3 = jax.nn.relu(_conv(h2, p["d2"], 2))
        u2 = jax.nn.relu(_conv(jnp.concatenate([up(h3), h2], axis=-1), p["u2"]))
        u1 = jax.nn.relu(_conv(jnp.concatenate([up(u2), h1], axis=-1), p["u1"]))
        return ((_conv(u1, p["out"]) - tgt) ** 2).mean()

    def step(p, x, tgt):
        l, g = jax.value_and_grad(loss)(p, x, tgt)
        return _sgd(p, g), l

    return step, (params, x, tgt), {"title": "U-Net (NHWC convs, 2 levels)", "params": (0,), "data": (1, 2)}


# -- 6. wide MLP with Adam and a memory limit -------------------------------------------------
def mlp_wide(size: str):
    b, d, f = (16, 32, 256) if size == "tiny" else (64, 512, 4096)
    rng = _rng(6)
    params = {"w1": _w(rng, d, f), "w2": _w(rng, f, d), "w3": _w(rng, d, f), "w4": _w(rng, f, d)}
    opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params)}
    x = _w(rng, b, d, scale=1.0)
    y = _w(rng, b, d, scale=1.0)

    def loss(p, x, y):
        h = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        h = h + jax.nn.gelu(h @ p["w3"]) @ p["w4"]
        return ((h - y) ** 2).mean()

    def step(p, opt, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        p, opt = _adam(p, opt, g)
        return p, opt, l

    state = 3 * sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(params))
    return step, (params, opt, x, y), {"title": "wide MLP, Adam, memory limit", "params": (0, 1), "data": (2, 3),
                                       "memory_limit": int(0.6 * state)}


# -- 7. DLRM-like -------------------------------------------------------------------------------------
def dlrm(size: str):
    b, nt, vocab, dim, dense = (16, 4, 64, 16, 8) if size == "tiny" else (256, 6, 8192, 64, 16)
    rng = _rng(7)
    nf = nt + 1
    params = {"tables": {f"t{i}": _w(rng, vocab, dim, scale=0.05) for i in range(nt)},
              "bot1": _w(rng, dense, 4 * dim), "bot2": _w(rng, 4 * dim, dim),
              "top1": _w(rng, dim + nf * nf, 256), "top2": _w(rng, 256, 1)}
    ids = jnp.asarray(rng.integers(0, vocab, (b, nt)), jnp.int32)
    xd = _w(rng, b, dense, scale=1.0)
    lbl = jnp.asarray(rng.integers(0, 2, (b,)), F32)

    def loss(p, ids, xd, lbl):
        bot = jax.nn.relu(jax.nn.relu(xd @ p["bot1"]) @ p["bot2"])
        embs = [jnp.take(p["tables"][f"t{i}"], ids[:, i], axis=0) for i in range(nt)]
        z = jnp.stack([bot] + embs, axis=1)  # [b, nf, dim]
        inter = jnp.einsum("bfd,bgd->bfg", z, z).reshape(b, nf * nf)
        logit = (jax.nn.relu(jnp.concatenate([bot, inter], axis=-1) @ p["top1"]) @ p["top2"])[:, 0]
        return (jnp.maximum(logit, 0) - logit * lbl + jnp.log1p(jnp.exp(-jnp.abs(logit)))).mean()

    def step(p, ids, xd, lbl):
        l, g = jax.value_and_grad(loss)(p, ids, xd, lbl)
        return _sgd(p, g), l

    return step, (params, ids, xd, lbl), {"title": "DLRM-like (embedding tables)", "params": (0,), "data": (1, 2, 3)}


# -- 8. scanned 12-layer stack --------------------------------------------------------------------
def scan_stack(size: str):
    layers = 12
    b, t, d, f = (8, 4, 16, 32) if size == "tiny" else (8, 64, 128, 512)
    rng = _rng(8)
    params = {"ln": jnp.ones((layers, d), F32), "w1": _w(rng, layers, d, f), "w2": _w(rng, layers, f, d)}
    x = _w(rng, b, t, d, scale=1.0)
    y = _w(rng, b, t, d, scale=1.0)

    def loss(p, x, y):
        def body(h, w):
            return h + jax.nn.gelu(_rms_norm(h, w["ln"]) @ w["w1"]) @ w["w2"], None

        h, _ = lax.scan(body, x, p)
        return ((h - y) ** 2).mean()

    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return _sgd(p, g, 1e-3), l

    return step, (params, x, y), {"title": "scanned 12-layer stack", "params": (0,), "data": (1, 2)}


MODELS = {"gpt2": gpt2, "t5": t5, "vit": vit, "moe": moe, "unet": unet, "mlp_wide": mlp_wide, "dlrm": dlrm,
          "scan_stack": scan_stack}
MESHES = (((2, 4), ("x", "y")), ((8,), ("x",)))


def make(name: str, size: str):
    """(fn, args, info) of one model of the zoo."""
    fn, args, info = MODELS[name](size)
    return fn, args, dict(info, name=name)


# -- hand plans -------------------------------------------------------------------------------------
def _path(kp) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp)


def _specs(tree, rule):
    """A spec per leaf: ``rule(path, leaf)`` (None: replicated)."""
    return jax.tree_util.tree_map_with_path(lambda kp, a: rule(_path(kp), a) or P(*([None] * a.ndim)), tree)


def _rep(tree):
    return _specs(tree, lambda p, a: None)


def _lead(ax, a):
    return P(ax, *([None] * (a.ndim - 1)))


def _data(args, info, ax):
    """Data arguments batch-split over ``ax`` (a name or a tuple), params replicated."""
    out = []
    for i, a in enumerate(args):
        out.append(_specs(a, lambda p, l: _lead(ax, l)) if i in info["data"] else _rep(a))
    return tuple(out)


def _with_params(args, info, data_ax, rule):
    """Params (and optimizer state, same layout) by ``rule``; data batch-split over data_ax (None: replicated)."""
    out = []
    for i, a in enumerate(args):
        if i in info["data"]:
            out.append(_specs(a, lambda p, l: _lead(data_ax, l)) if data_ax else _rep(a))
        elif i == 0:
            out.append(_specs(a, rule))
        else:  # optimizer state {"m": params-like, "v": params-like}
            out.append({k: _specs(v, rule) for k, v in a.items()})
    return tuple(out)


def _megatron_rule(name: str, ax):
    """Megatron (tensor parallel) specs by parameter name, over axis ``ax``."""
    def rule(path: str, a):
        leaf = path.split("/")[-1]
        if name in ("gpt2", "vit") or (name == "mlp_wide"):
            if leaf in ("wq", "wk", "wv", "w1", "w3"):
                return P(None, ax)
            if leaf in ("wo", "w2", "w4"):
                return P(ax, None)
            if leaf == "wte":
                return P(ax, None)  # vocab-parallel tied embedding
        if name == "t5":
            if leaf in ("wq", "wk", "wv"):
                return P(None, ax, None)
            if leaf == "wo" and a.ndim == 3:
                return P(ax, None, None)
            if leaf == "wi":
                return P(None, ax)
            if leaf == "wo":
                return P(ax, None)
        if name == "moe":
            if leaf == "wi":
                return P(None, None, ax)
            if leaf == "wo":
                return P(None, ax, None)
        if name == "scan_stack":
            if leaf == "w1":
                return P(None, None, ax)
            if leaf == "w2":
                return P(None, ax, None)
        if name == "dlrm" and "tables" in path:
            return P(ax, None)  # row (vocab) sharded tables
        return None
    return rule


def _2d_rule(name: str, a0, a1):
    """The GSPMD paper's 2D weight layout: W_in [d, f] as (a0, a1), W_out [f, d] as (a1, a0)."""
    def rule(path: str, a):
        leaf = path.split("/")[-1]
        if name == "mlp_wide":
            return P(a0, a1) if leaf in ("w1", "w3") else P(a1, a0)
        if name == "scan_stack":
            return {"w1": P(None, a0, a1), "w2": P(None, a1, a0), "ln": P(None, a1)}[leaf]
        return None
    return rule


def hand_plans(name: str, mesh: gp.Mesh, args, info) -> dict:
    """name -> gp.spmd keyword arguments of each plan an expert would write for this model and mesh."""
    axes = tuple(mesh.axis_names)
    allax = axes if len(axes) > 1 else axes[0]
    two = len(axes) == 2
    plans = {"replicated": dict(in_shardings=tuple(_rep(a) for a in args))}
    if name != "moe":
        plans[f"data parallel ({','.join(axes)})"] = dict(in_shardings=_data(args, info, allax))
    data_n, par_n = tuple(info["data"]), tuple(info["params"])
    plans[f"FSDP / ZeRO-3 ({','.join(axes)})"] = dict(
        tactics=[gp.tactics.batch(a, argnums=data_n) for a in axes] + [gp.tactics.zero(a, argnums=par_n) for a in axes])
    if name not in ("unet", "dlrm"):
        plans[f"Megatron ({','.join(axes)})"] = dict(in_shardings=_with_params(args, info, None,
                                                                               _megatron_rule(name, allax)))
        if two:
            plans["data parallel (x) + Megatron (y)"] = dict(
                in_shardings=_with_params(args, info, "x", _megatron_rule(name, "y")))
    if two and name in ("mlp_wide", "scan_stack"):
        plans["2D (GSPMD: weights (x,y)/(y,x), batch x)"] = dict(
            in_shardings=_with_params(args, info, "x", _2d_rule(name, "x", "y")))
    if name == "moe":
        ep = lambda ax: (lambda path, a: P(ax, None, None) if path.split("/")[-1] in ("wi", "wo") else None)
        plans[f"expert parallel ({','.join(axes)}) + groups ({','.join(axes)})"] = dict(
            in_shardings=_with_params(args, info, allax, ep(allax)))
        if two:
            plans["expert parallel (y) + groups (x,y)"] = dict(in_shardings=_with_params(args, info, allax, ep("y")))
        plans[f"data parallel over groups ({','.join(axes)})"] = dict(in_shardings=_data(args, info, allax))
    if name == "unet":
        sp = lambda *ax: P(*ax, *([None] * 2))
        if two:
            plans["spatial: batch (x) + H (y)"] = dict(in_shardings=_with_params(args, info, None, lambda p, a: None)[:1]
                                                       + (sp("x", "y"), sp("x", "y")))
            plans["spatial: H (x) x W (y)"] = dict(in_shardings=_with_params(args, info, None, lambda p, a: None)[:1]
                                                   + (P(None, "x", "y", None), P(None, "x", "y", None)))
        else:
            plans["spatial: H (x)"] = dict(in_shardings=_with_params(args, info, None, lambda p, a: None)[:1]
                                           + (sp(None, "x"), sp(None, "x")))
    if name == "dlrm":
        col = lambda ax: (lambda path, a: P(None, ax) if "tables" in path else None)
        if two:
            plans["tables column-sharded (y) + data parallel (x)"] = dict(
                in_shardings=_with_params(args, info, "x", col("y")))
            plans["tables column-sharded (x,y) + data parallel (x,y)"] = dict(
                in_shardings=_with_params(args, info, allax, col(allax)))
        else:
            plans["tables column-sharded (x) + data parallel (x)"] = dict(
                in_shardings=_with_params(args, info, "x", col("x")))
        plans[f"tables row-sharded ({','.join(axes)}) + data parallel"] = dict(
            in_shardings=_with_params(args, info, allax, _megatron_rule(name, allax)))
    return plans


# -- the benchmark: ``python -m benchmarks --only zoo`` ------------------------------------------------
QUICK_MODELS = ("gpt2", "moe", "dlrm", "mlp_wide")


def _placed(f, args):
    """The arguments as global jax.Arrays in the plan's input shardings (a training loop's steady state)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return jax.tree_util.tree_unflatten(tree, f.plan(*args).place(leaves))


def _spec_text(plan) -> str:
    return str(plan.in_shardings) + str(plan.out_shardings)


REPEATS = 21  # interleaved samples per plan (7 with --quick)


def case(name: str, mesh_shape, axis_names, quick: bool) -> dict:
    """One (model, mesh): every hand plan and the searched plan, predicted and measured interleaved."""
    import time

    from .auto import calibrated
    from .timing import interleaved

    fn, args, info = make(name, "bench")
    mesh = gp.Mesh(mesh_shape, axis_names)
    hw = calibrated(tuple(mesh_shape), tuple(axis_names))
    limit = info.get("memory_limit")
    fns = {k: gp.spmd(fn, mesh, **kw) for k, kw in hand_plans(name, mesh, args, info).items()}
    out = {"name": name, "title": info["title"], "mesh": tuple(mesh_shape), "limit": limit, "crash": "",
           "search_s": float("nan"), "explored": 0, "rows": {}, "broken": {}}
    t0 = time.perf_counter()
    try:
        res = gp.auto_shard(fn, mesh, *args, hardware=hw, memory_limit=limit)
        out["search_s"], out["explored"] = time.perf_counter() - t0, res.explored
        out["decisions"] = res.search.best.text
        out["stopped_by"] = res.search.stopped_by
        out["starts"] = [(n, c.price.step_s, c.fits) for n, c in res.search.baselines]
        fns["searched (calibrated)"] = res.spmd
    except Exception as e:  # noqa: BLE001 - a crash is a result here: recorded, never hidden
        out["search_s"] = time.perf_counter() - t0
        out["crash"] = f"{type(e).__name__}: {str(e)[:400]}"
    calls, texts, progs = {}, {}, {}
    for k, f in list(fns.items()):
        try:
            plan = f.plan(*args)
            c = plan.cost(hw)
            texts[k] = _spec_text(plan)
            progs[k] = plan.spmd_text()
            placed = _placed(f, args)
            jax.block_until_ready(f(*placed))
            calls[k] = (lambda f=f, a=placed: jax.block_until_ready(f(*a)))
            out["rows"][k] = {"pred": c.step_s, "peak": c.peak_memory_bytes, "comm": c.comm_bytes}
        except Exception as e:  # noqa: BLE001 - a hand plan that does not build is reported
            out["broken"][k] = f"{type(e).__name__}: {str(e)[:300]}"
            if k.startswith("searched"):
                out["crash"] = out["crash"] or f"searched plan does not run: {out['broken'][k]}"
    fastest: dict = {}
    med = interleaved(calls, repeats=7 if quick else REPEATS, warmup=1, mins=fastest)
    for k in calls:
        out["rows"][k].update(meas=fastest[k], med=med[k])
    s = texts.get("searched (calibrated)")
    out["same"] = next((k for k in texts if k != "searched (calibrated)" and texts[k] == s), None) if s else None
    sp = progs.get("searched (calibrated)")
    twin = next((k for k in progs if k != "searched (calibrated)" and progs[k] == sp), None) if sp else None
    out["twin"] = twin
    if twin and twin in calls:  # one per-device program measured twice: its samples pooled (the fastest of both)
        fastest = dict(fastest)
        fastest["searched (calibrated)"] = fastest[twin] = min(fastest[twin], fastest["searched (calibrated)"])
    hand = [k for k in calls if not k.startswith("searched") and (limit is None or out["rows"][k]["peak"] <= limit)]
    out["best"] = min(hand, key=lambda k: fastest[k]) if hand else None
    out["best_pred"] = min(hand, key=lambda k: out["rows"][k]["pred"]) if hand else None
    if "searched (calibrated)" in calls and out["best"]:
        out["ratio"] = fastest["searched (calibrated)"] / fastest[out["best"]]
        med = dict(med)
        if twin and twin in calls:  # one program: the mean of its two medians
            med["searched (calibrated)"] = med[twin] = (med[twin] + med["searched (calibrated)"]) / 2
        out["best_med"] = min(hand, key=lambda k: med[k])
        out["ratio_med"] = med["searched (calibrated)"] / med[out["best_med"]]
    return out


def _table(c: dict) -> str:
    from .report import md_table
    from .timing import fmt_s

    rows = []
    best = c["best"]
    for k, r in c["rows"].items():
        label = k + (f" (= {c['same']})" if k.startswith("searched") and c.get("same") else "")
        over = c["limit"] is not None and r["peak"] > c["limit"]
        rows.append([label, fmt_s(r["pred"]), f"{fmt_s(r['meas'])} ({fmt_s(r['med'])})",
                     f"{r['meas'] / c['rows'][best]['meas']:.2f}x" if best else "-",
                     f"{r['peak'] / 2**20:.1f} MiB" + (" (over the limit)" if over else ""),
                     f"{r['comm'] / 2**20:.2f} MiB"])
    for k, e in c["broken"].items():
        rows.append([k, "does not build", "-", "-", "-", e[:120].replace("|", "/")])
    return md_table(["plan", "predicted (calibrated)", "measured: fastest (median)", "vs best hand measured",
                     "peak memory predicted", "collective bytes"], rows)


def run(quick: bool) -> str:
    import math

    from .timing import fmt_s

    names = QUICK_MODELS if quick else tuple(MODELS)
    cases = []
    for name in names:
        for shape, axes in MESHES:
            c = case(name, shape, axes, quick)
            cases.append(c)
            print(f"  zoo {name} {shape}: searched/best {c.get('ratio', float('nan')):.2f}x (best {c['best']}), "
                  f"search {c['search_s']:.1f} s{', CRASH ' + c['crash'] if c['crash'] else ''}", flush=True)
    text = ("## gp.auto_shard on the held-out model zoo (benchmarks/zoo.py), 8 CPU devices\n\n"
            "Eight training steps written as users write them (benchmarks/zoo.py, size \"bench\"), on the meshes "
            "(2, 4) and (8,). Every hand plan an expert writes for the model and mesh, and `gp.auto_shard`'s plan "
            "searched with this machine's calibrated hardware (`gp.Hardware.calibrate`, once per mesh per run) and "
            "its defaults otherwise (time budget 30 s; `memory_limit` where the model has one), are predicted on the "
            "calibrated hardware and measured here interleaved, inputs placed in each plan's input shardings: the "
            f"fastest of {7 if quick else REPEATS} samples (median in brackets; the machine's 2 cores are shared, the "
            "fastest sample is the least disturbed; ratios use it). Under a memory limit only hand plans predicted "
            "to fit compete for best. A searched plan with a hand plan's in/out shardings says so (`= ...`); where it "
            "builds the very same per-device program (`plan.spmd_text()` equal), the two are one program measured "
            "twice, and the ratio uses the fastest sample of both (the rows show each one's own samples).\n\n")
    ratios, within, crashes, worst, meds = [], 0, 0, (0.0, ""), []
    for c in cases:
        text += f"### {c['title']} on {c['mesh']}\n\n"
        lim = f"memory limit {c['limit'] / 2**20:.1f} MiB per device; " if c["limit"] else ""
        if c["crash"]:
            crashes += 1
            text += f"**auto_shard crashed** after {c['search_s']:.1f} s: `{c['crash']}`\n\n"
        else:
            stop = f" (stopped by its {c['stopped_by']} budget)" if c.get("stopped_by") else ""
            starts = ", ".join(f"{n} {fmt_s(t)}{'' if ok else ' (does not fit)'}" for n, t, ok in c.get("starts", []))
            text += (f"{lim}search {c['search_s']:.1f} s{stop}, {c['explored']} candidates; decisions: "
                     f"`{c.get('decisions', '')[:300]}`; its start states predicted: {starts}\n\n")
        text += _table(c) + "\n\n"
        if "ratio" in c:
            r = c["ratio"]
            ratios.append(r)
            within += r <= 1.10
            if r > worst[0]:
                worst = (r, f"{c['name']} {c['mesh']}")
            pooled = (f" (the searched plan builds the same per-device program as `{c['twin']}`: their samples "
                      f"pooled)" if c.get("twin") else "")
            text += (f"searched / best hand measured ({c['best']}): **{r:.2f}x**{pooled}; by medians: "
                     f"{c['ratio_med']:.2f}x ({c['best_med']}); best hand predicted: {c['best_pred']}\n\n")
            meds.append(c["ratio_med"])
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    summary = (f"within 10% of the best measured plan: {within} of {len(cases)}; geometric mean {gm:.2f}x; "
               f"worst {worst[0]:.2f}x ({worst[1]}); crashes {crashes}")
    if meds:
        gmm = math.exp(sum(map(math.log, meds)) / len(meds))
        summary += (f" (by medians instead of fastest samples: {sum(m <= 1.10 for m in meds)} of {len(cases)} within "
                    f"10%, geometric mean {gmm:.2f}x, worst {max(meds):.2f}x)")
    print("  " + summary, flush=True)
    return text + "**Summary:** " + summary + "\n"
