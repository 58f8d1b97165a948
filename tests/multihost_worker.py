"""The script that tests/runtime/test_multihost.py runs under ``python -m gspmd_py.launch``.

    python -m gspmd_py.launch -n 2 --devices-per-process 4 tests/multihost_worker.py MODE OUT

MODE: ``mlp`` (Megatron MLP on two meshes, global and local inputs, uneven dims; process 0
writes OUT.npz), ``mismatch`` (process 1 plans a different program), ``crash`` (process 1
dies while process 0 waits in a collective). The functions are imported by the test too,
to compute the 1-process x 8-device results.
"""
from __future__ import annotations

import sys

import numpy as np

ROWS, D, F = 7, 16, 32  # 7 rows: uneven over 2 processes (4 + 3) and over 8 devices


def mlp(x, w1, w2):
    import jax

    return jax.nn.gelu(x @ w1) @ w2


def mlp_inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((ROWS, D)).astype(np.float32),
            (rng.standard_normal((D, F)) * D ** -0.5).astype(np.float32),
            (rng.standard_normal((F, D)) * F ** -0.5).astype(np.float32))


def meshes():
    """name -> mesh over 8 devices. "tp_inside": Megatron axis "y" inside a process (hosts-major
    default); "tp_across": "y" (size 2) pairs devices of different processes."""
    import jax

    import gspmd_py as gp

    ids = [d.id for d in gp.distributed.hosts_major(jax.devices())]
    across = np.asarray(ids).reshape(2, 4).T  # column j = process j (on 2 processes)
    return {"tp_inside": gp.Mesh((2, 4), ("x", "y")), "tp_across": gp.Mesh((4, 2), ("x", "y"), devices=across)}


def mlp_results(log=lambda *a: None) -> dict:
    """Every MLP result this test compares, as numpy (the same call on 1 or many processes)."""
    import jax

    import gspmd_py as gp

    P = gp.P
    x, w1, w2 = mlp_inputs()
    out = {}
    for name, mesh in meshes().items():
        out[f"{name}/spanning"] = np.asarray([a in gp.distributed.axes_spanning_processes(mesh)
                                              for a in mesh.axis_names])
        specs = (P("x", None), P(None, "y"), P("y", None))
        f = gp.spmd(mlp, mesh, in_shardings=specs)
        out[f"{name}/global"] = gp.to_host(f(x, w1, w2))                 # full arrays on every process
        # this process's blocks only (x: uneven rows, so its global shape is given)
        blocks = [a[gp.distributed.local_slices(mesh, s, a.shape)] for a, s in zip((x, w1, w2), specs)]
        out[f"{name}/local"] = gp.to_host(f.from_local(*blocks, global_shapes=(x.shape, None, None)))
        # w2 without an in_sharding: passed whole, laid out as propagation decides
        f2 = gp.spmd(mlp, mesh, in_shardings=specs[:2] + (None,))
        out[f"{name}/local_open"] = gp.to_host(f2.from_local(*blocks[:2], w2, global_shapes=(x.shape, None, None)))
        # 3 rows over all 8 devices: process 0 holds rows 0-2, process 1 an empty block (on one
        # process: all). The axis spanning processes goes major, so each process holds one block.
        span = gp.distributed.axes_spanning_processes(mesh)
        spec_e = P(span + tuple(a for a in mesh.axis_names if a not in span), None)
        fe = gp.spmd(mlp, mesh, in_shardings=(spec_e,) + specs[1:])
        xe = x[:3][gp.distributed.local_slices(mesh, spec_e, (3, D))]
        out[f"{name}/local_empty"] = gp.to_host(fe.from_local(xe, *blocks[1:], global_shapes=((3, D), None, None)))
        # a global output as the next input, in another layout: padded rows, split columns
        # (a jitted re-layout across processes)
        g = gp.spmd(lambda h, w: h @ w, mesh, in_shardings=(P("x", "y"), P("y", None)))
        out[f"{name}/chained"] = gp.to_host(g(f(x, w1, w2), w2.T))
        log(f"{name}: spanning {out[f'{name}/spanning'].tolist()}, blocks {[b.shape for b in blocks]}, "
            f"collectives {[c.kind + str(tuple(c.axes)) for c in f.plan(x, w1, w2).collectives]}")
    log(f"process {jax.process_index()}: done")
    return out


def main(argv) -> int:
    mode, out = argv[0], argv[1] if len(argv) > 1 else None
    import gspmd_py as gp

    gp.distributed.initialize()
    import jax

    P = gp.P
    if mode == "mlp":
        res = mlp_results(print)
        if out and jax.process_index() == 0:
            np.savez(out, **res)
        return 0
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x, w1, w2 = mlp_inputs()
    if mode == "mismatch":
        def differs(x, w1, w2):  # process 1 adds a tanh: a different program
            h = x @ w1
            h = jax.numpy.tanh(h) if jax.process_index() == 1 else h
            return h @ w2

        f = gp.spmd(differs, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
        try:
            f(x, w1, w2)
        except gp.ProgramMismatchError as e:
            print(f"MISMATCH {e}")
            return 0
        print("NO MISMATCH DETECTED")
        return 1
    if mode == "crash":
        f = gp.spmd(mlp, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
        if jax.process_index() == 1:
            raise RuntimeError("process 1 fails on purpose")
        print(gp.to_host(f(x, w1, w2)))  # blocks: process 1 never joins
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
