"""The GSPMD paper's dense decoder LMs, costed on paper: DenseLm128B on 128 / 512 / 2048 TPU v3 cores.

    python benchmarks/cost_denselm.py [--layers 64] [--table] [--extra] [--out benchmarks/results]
    python -m benchmarks --only denselm

Lingvo's ``lm.synthetic_packed_input.DenseLm128B8x8`` / ``16x16`` / ``32x32`` (the GSPMD
paper's Table "dense Transformer", Xu et al. 2021, section 5): 64 decoder layers of
[self-attention, gated-GELU feed-forward], d_model 8192, FFN 65536, 128 heads x 128,
sequence 1024, vocabulary 32000, float32 weights computed in bfloat16, factored Adafactor
(beta1 = 0); global batch 16 / 128 / 512 on meshes [8,16] / [16,32] / [32,64] of TPU v3
cores, 2D sharding (mesh axes X, Y):

    activations [B,L,M] on [X,-,Y]; FFN in-weights [M,H] on [X,Y], out-weight [H,M] on [Y,X];
    attention weights [M,heads,D] on [X,Y,-], output projection [heads,D,M] on [Y,-,X];
    attention activations [B,L,heads,D] on [X,-,Y,-], FFN hidden [B,L,H] on [X,-,Y];
    embedding / softmax weight [V,M] on [-,Y], logits [B,L,V] on [X,-,Y].

The whole training step (embedding, 64 layers as a ``lax.scan`` of ``jax.checkpoint``-ed
layers, as Lingvo recomputes each layer in the backward pass, softmax cross-entropy,
Adafactor update) is planned on ``gp.Mesh.abstract`` meshes (no devices) and costed on
the "tpu-v3" preset. The script prints per configuration the predicted memory per core,
the collective bytes per layer by kind, the step time and tokens/s beside Lingvo's stated
throughput ("Expect ~ 3.7k / 18k / 62k tokens/sec" in the config file), and writes them to
``benchmarks/results/cost_denselm.md``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from typing import NamedTuple

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import gspmd_py as gp  # noqa: E402
from machine import RESULTS, describe, write  # noqa: E402

P = gp.P
BF16, F32 = jnp.bfloat16, jnp.float32

# (name, mesh, global batch, Lingvo's stated tokens/s)
CONFIGS = [
    ("DenseLm128B8x8", (8, 16), 16, 3.7e3),
    ("DenseLm128B16x16", (16, 32), 128, 18e3),
    ("DenseLm128B32x32", (32, 64), 512, 62e3),
]
# beyond the paper: the same model on 8,192 cores (no Lingvo figure), as a scaling check
EXTRA = [("DenseLm128B64x128", (64, 128), 2048, None)]
M, H, NH, D, L, V = 8192, 65536, 128, 128, 1024, 32000


# one layer's weights (the scan stacks them on a leading, unsharded layer dim)
LAYER_SPECS = {"wq": P("x", "y", None), "wk": P("x", "y", None), "wv": P("x", "y", None), "wo": P("y", None, "x"),
               "wi0": P("x", "y"), "wi1": P("x", "y"), "wout": P("y", "x"), "ln1": P("y"), "ln2": P("y")}


def rms_norm(x, scale):
    x32 = x.astype(F32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale).astype(BF16)


def layer(p, x):
    """One decoder layer: x + attention(LN(x)), then + gated-GELU FFN(LN(x))."""
    act = lambda t: gp.annotate(t, P("x", None, "y"))
    heads = lambda t: gp.annotate(t, P("x", None, "y", None))
    p = {k: gp.annotate(w, LAYER_SPECS[k]) for k, w in p.items()}  # one layer's slice keeps its sharding
    x = act(x)  # (also the layer input the backward pass recomputes from)
    h = rms_norm(x, p["ln1"])
    q = heads(jnp.einsum("blm,mhd->blhd", h, p["wq"].astype(BF16)))
    k = heads(jnp.einsum("blm,mhd->blhd", h, p["wk"].astype(BF16)))
    v = heads(jnp.einsum("blm,mhd->blhd", h, p["wv"].astype(BF16)))
    logits = jnp.einsum("blhd,bshd->bhls", q, k, preferred_element_type=F32) * D ** -0.5
    causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), jnp.bool_))
    logits = jnp.where(causal, logits, -1e9)
    w = jax.nn.softmax(logits, axis=-1).astype(BF16)
    o = heads(jnp.einsum("bhls,bshd->blhd", w, v))
    x = act(x + jnp.einsum("blhd,hdm->blm", o, p["wo"].astype(BF16)))
    h = rms_norm(x, p["ln2"])
    ff = act(jax.nn.gelu(h @ p["wi0"].astype(BF16)) * (h @ p["wi1"].astype(BF16)))
    return act(x + ff @ p["wout"].astype(BF16))


def embed(emb, ids):
    x = jnp.einsum("blv,vm->blm", jax.nn.one_hot(ids, emb.shape[0], dtype=BF16), emb.astype(BF16))
    return gp.annotate(x, P("x", None, "y"))


def head_loss(emb, ln_f, x, labels):
    x = rms_norm(gp.annotate(x, P("x", None, "y")), ln_f)
    logits = gp.annotate(jnp.einsum("blm,vm->blv", x, emb.astype(BF16), preferred_element_type=F32),
                         P("x", None, "y"))
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, emb.shape[0], dtype=F32) * logp, axis=-1))


def adafactor(p, g, s, lr=1e-3, decay=0.99, eps=1e-30, clip=1.0):
    """Factored Adafactor, beta1 = 0 (Shazeer and Stern 2018) on one weight: row and column
    second moments over its last two dims, update clipping, relative step size."""
    g2 = g * g + eps
    if p.ndim >= 2:
        vr = decay * s["vr"] + (1 - decay) * jnp.mean(g2, axis=-1)
        vc = decay * s["vc"] + (1 - decay) * jnp.mean(g2, axis=-2)
        v = vr[..., :, None] * vc[..., None, :] / jnp.mean(vr, axis=-1, keepdims=True)[..., None]
        new = {"vr": vr, "vc": vc}
    else:
        v = decay * s["v"] + (1 - decay) * g2
        new = {"v": v}
    u = g * lax.rsqrt(v)
    u = u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(u * u)) / clip)
    scale = jnp.maximum(1e-3, jnp.sqrt(jnp.mean(p * p)))
    return p - lr * scale * u, new


def update(params, grads, state):
    out = {k: adafactor(params[k], grads[k], state[k]) for k in params}
    return {k: o[0] for k, o in out.items()}, {k: o[1] for k, o in out.items()}


# -- the programs of one training step (64 layers: the layer programs run 64 times each) --------
def layer_forward(p, x):
    """The forward pass through one layer (only its input is kept for the backward pass)."""
    return layer(p, x)


def layer_backward(p, state, x, dy):
    """The backward pass through one layer: recompute its forward from its input (Lingvo's
    per-layer rematerialization), back-propagate, update its weights (Adafactor)."""
    _, vjp = jax.vjp(layer, p, x)
    g, dx = vjp(dy)
    p, state = update(p, g, state)
    return p, state, dx


def head_forward(emb, ids):
    return embed(emb, ids)


def head_backward(emb, ln_f, x, labels):
    """Final norm, softmax cross-entropy and their gradients, the embedding's gradient (input
    and output sides of the shared weight), the update of the embedding and final norm."""
    loss, vjp = jax.vjp(lambda e, s, x: head_loss(e, s, x, labels), emb, ln_f, x)
    d_emb, d_lnf, dx = vjp(jnp.ones((), F32))
    return loss, d_emb, d_lnf, dx


def head_update(emb, ln_f, state, ids, dx0, d_emb_out, d_lnf):
    _, vjp = jax.vjp(lambda e: embed(e, ids), emb)
    (d_emb_in,) = vjp(dx0)
    params, state = update({"emb": emb, "ln_f": ln_f}, {"emb": d_emb_in + d_emb_out, "ln_f": d_lnf}, state)
    return params["emb"], params["ln_f"], state


def slot_spec(spec) -> dict:
    """Adafactor slots follow their weight's dims (row moments drop the last dim, columns the one before)."""
    dims = tuple(spec)
    if len(dims) >= 2:
        return {"vr": P(*dims[:-1]), "vc": P(*(dims[:-2] + dims[-1:]))}
    return {"v": P(*dims)}


def slot_shapes(shape) -> dict:
    S = jax.ShapeDtypeStruct
    if len(shape) >= 2:
        return {"vr": S(shape[:-1], F32), "vc": S(shape[:-2] + shape[-1:], F32)}
    return {"v": S(shape, F32)}


def plans(mesh_shape, batch, m=M, h=H, nh=NH, d=D, seq=L, vocab=V) -> dict:
    """name -> (plan, donated flat inputs, runs per step), on an abstract mesh."""
    S = jax.ShapeDtypeStruct
    mesh = gp.Mesh.abstract(mesh_shape, ("x", "y"))
    shp = {"wq": (m, nh, d), "wk": (m, nh, d), "wv": (m, nh, d), "wo": (nh, d, m), "wi0": (m, h), "wi1": (m, h),
           "wout": (h, m), "ln1": (m,), "ln2": (m,)}
    lp = {k: S(v, F32) for k, v in shp.items()}
    ls = {k: slot_shapes(v) for k, v in shp.items()}
    lspec = dict(LAYER_SPECS)
    sspec = {k: slot_spec(v) for k, v in lspec.items()}
    act = S((batch, seq, m), BF16)
    ids = S((batch, seq), jnp.int32)
    emb, lnf = S((vocab, m), F32), S((m,), F32)
    hstate = {"emb": slot_shapes((vocab, m)), "ln_f": slot_shapes((m,))}
    hspec = {"emb": slot_spec(P(None, "y")), "ln_f": slot_spec(P("y"))}
    A = P("x", None, "y")
    n_p, n_s = len(jax.tree_util.tree_leaves(lp)), len(jax.tree_util.tree_leaves(ls))

    def mk(fn, ins, outs, args):
        return gp.spmd(fn, mesh, in_shardings=ins, out_shardings=outs).plan(*args)

    return {
        # name: Prog(plan, donated flat inputs, runs once per layer?, resident inputs (weights,
        # optimizer state: leading flat inputs), saved activations (flat input indices))
        "layer forward": Prog(mk(layer_forward, (lspec, A), A, (lp, act)), (), True, n_p, (n_p,)),
        "layer backward": Prog(mk(layer_backward, (lspec, sspec, A, A), (lspec, sspec, A), (lp, ls, act, act)),
                               tuple(range(n_p + n_s)), True, n_p + n_s, (n_p + n_s,)),
        "embedding": Prog(mk(head_forward, (P(None, "y"), P("x", None)), A, (emb, ids)), (), False, 1, ()),
        "softmax + loss": Prog(mk(head_backward, (P(None, "y"), P("y"), A, P("x", None)),
                                  (None, P(None, "y"), P("y"), A), (emb, lnf, act, ids)), (), False, 2, ()),
        "embedding update": Prog(mk(head_update, (P(None, "y"), P("y"), hspec, P("x", None), A, P(None, "y"),
                                                  P("y")), (P(None, "y"), P("y"), hspec),
                                    (emb, lnf, hstate, ids, act, emb, lnf)), (0, 1, 2, 3, 4, 5), False, 5, ()),
    }


class Prog(NamedTuple):
    plan: object
    donate: tuple
    per_layer: bool
    resident: int
    saved: tuple


def input_bytes(plan) -> list[int]:
    """Local (per-device) bytes of each flat input of the per-device program."""
    return [int(np.prod(v.aval.shape, dtype=np.int64)) * np.dtype(v.aval.dtype).itemsize
            for v in plan.program.jaxpr.invars]


def step(mesh_shape, batch, layers, hw, **dims) -> dict:
    """One training step on ``hw``: the costs of its programs, composed."""
    progs = plans(mesh_shape, batch, **dims)
    out = {"programs": {}, "step_s": 0.0, "step_overlap_s": 0.0, "flops": 0.0, "compute_s": 0.0, "comm_s": 0.0,
           "per_layer_bytes": {}}
    resident = saved = 0
    extra = 0
    for name, pr in progs.items():
        c = pr.plan.cost(hw, donate=pr.donate)
        co = pr.plan.cost(hw, donate=pr.donate, overlap=True)
        n = layers if pr.per_layer else 1
        out["programs"][name] = (c, n)
        out["step_s"] += n * c.step_s
        out["step_overlap_s"] += n * co.step_s
        out["flops"] += n * c.flops
        out["compute_s"] += n * c.compute_s
        out["comm_s"] += n * c.comm_s
        if pr.per_layer:
            for k, b in c.comm_bytes_by_kind.items():
                out["per_layer_bytes"][k] = out["per_layer_bytes"].get(k, 0) + b
        ib = input_bytes(pr.plan)
        mine = sum(ib[:pr.resident]) + sum(ib[i] for i in pr.saved)
        extra = max(extra, c.peak_memory_bytes - mine)  # this program's own buffers beyond the resident ones
        if name in ("layer backward", "embedding update"):
            resident += n * sum(ib[:pr.resident])  # every weight and optimizer slot, once
        if name == "layer forward":
            saved += n * sum(ib[i] for i in pr.saved)  # each layer's input, kept for its backward pass
    out["memory"] = resident + saved + extra
    out["memory_parts"] = (resident, saved, extra)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--table", action="store_true", help="print the layer backward program's per-op cost table")
    ap.add_argument("--extra", action="store_true", help="also cost the model on 8,192 cores (mesh [64,128])")
    ap.add_argument("--out", default=RESULTS, help="folder of cost_denselm.md")
    args = ap.parse_args(argv)
    rows, text = measure(args.layers, args.extra, args.table)
    extra = " (--extra)" if args.extra else ""
    title = f"# The GSPMD paper's dense LMs, costed on paper{extra}\n\n{describe()}\n\n"
    print(f"wrote {write('cost_denselm.md', title + section(text, args.layers), args.out)}")
    return rows


def run(quick: bool) -> str:
    """The ``denselm`` section of ``python -m benchmarks`` (markdown; planning needs no devices,
    so --quick changes nothing)."""
    return section(measure(64, False, False)[1], 64)


def section(text: str, layers: int) -> str:
    return ("## DenseLm128B on 128 / 512 / 2,048 TPU v3 cores, planned on abstract meshes (issue 11)\n\n"
            f"`python benchmarks/cost_denselm.py`: {layers} layers, the \"tpu-v3\" preset, per core; "
            "Lingvo's stated tokens/s beside the prediction.\n\n```\n" + text + "\n```\n")


def measure(layers: int, extra: bool = False, table: bool = False) -> tuple[list, str]:
    """Plan and cost every configuration; returns the rows and the printed text."""
    warnings.simplefilter("ignore", gp.PartitionWarning)
    hw = gp.Hardware.preset("tpu-v3")
    gib, mib = 2 ** 30, 2 ** 20
    rows = []
    for name, mesh_shape, batch, stated in CONFIGS + (EXTRA if extra else []):
        t0 = time.perf_counter()
        r = step(mesh_shape, batch, layers, hw)
        r["seconds"] = time.perf_counter() - t0
        rows.append((name, mesh_shape, batch, stated, r))
        if table:
            print(f"== {name}, layer backward\n{r['programs']['layer backward'][0].table(15)}\n")
    lines = [f"DenseLm128B ({layers} layers) planned on abstract meshes, costed on the tpu-v3 preset; "
             f"per core; collectives in MiB per layer (forward + backward):"]
    cells = [("config", "cores", "mesh", "batch", "memory", "AG", "RS", "AR", "A2A", "step", "overlapped",
              "tokens/s", "Lingvo", "ratio")]
    for name, ms, batch, stated, r in rows:
        pl = r["per_layer_bytes"]
        f = lambda k: f"{pl.get(k, 0) / mib:.0f}"  # noqa: E731
        tps = batch * L / r["step_s"]
        cells.append((name, str(ms[0] * ms[1]), "x".join(map(str, ms)), str(batch), f"{r['memory'] / gib:.2f} GiB",
                      f("all-gather"), f("reduce-scatter"), f("all-reduce"), f("all-to-all"),
                      f"{r['step_s']:.2f} s", f"{r['step_overlap_s']:.2f} s", f"{tps / 1e3:.1f}k",
                      f"{stated / 1e3:.1f}k" if stated else "-", f"{tps / stated:.2f}" if stated else "-"))
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(row, widths))))
    lines.append("")
    for name, ms, batch, stated, r in rows:
        res, sav, ext = r["memory_parts"]
        util = r["flops"] / r["step_s"] / hw.peak("bfloat16")
        lines.append(f"{name}: {r['flops'] / 1e12:.1f} TFLOP per core per step, compute {r['compute_s']:.2f} s + "
                     f"communication {r['comm_s']:.2f} s ({100 * util:.0f}% of peak); memory = weights + Adafactor "
                     f"{res / gib:.2f} GiB + saved layer inputs {sav / gib:.2f} GiB + largest program's own buffers "
                     f"{ext / gib:.2f} GiB{'' if r['memory'] <= hw.mem_capacity else ' (DOES NOT FIT in 16 GiB)'}; "
                     f"planned and costed in {r['seconds']:.0f} s without devices")
    text = "\n".join(lines)
    print(text)
    return rows, text


if __name__ == "__main__":
    main()
