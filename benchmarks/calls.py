"""gspmd_py against ``jax.jit`` with the same shardings, on the reference programs.

Per program, in ONE process and interleaved: per-call time with numpy inputs and with
inputs already placed, first-call time of fresh function objects (trace + plan +
compile + run, in a warm process), and collectives (ours: ``plan.collectives``; XLA's:
counted in its compiled HLO). The first call in a FRESH process (after a trivial
``jax.jit`` has warmed JAX itself up) runs in subprocesses, ours and jax.jit's
alternately: that is where one-time costs of gspmd_py (imports, first traces) show.

    python -m benchmarks --only calls --quick
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import attrs

from . import hlo
from .programs import Program, even_spec, gp_constrain, jax_constrain_for, programs
from .timing import interleaved, once_interleaved


@attrs.define
class CallResult:
    name: str
    title: str
    numpy_ours: float = float("nan")
    numpy_jit: float = float("nan")
    placed_ours: float = float("nan")
    placed_jit: float = float("nan")
    first_ours: float = float("nan")
    first_jit: float = float("nan")
    cold_ours: float = float("nan")
    cold_jit: float = float("nan")
    colls_ours: tuple = (0, 0, "none")  # (count, bytes, kinds) from plan.collectives
    colls_ours_hlo: tuple = (0, 0, "none")  # the same, counted in our compiled HLO
    colls_xla: tuple = (0, 0, "none")
    max_abs_err: float = float("nan")
    mins: dict = attrs.Factory(dict)  # fastest sample per timing (numpy_ours, ...)


def _block(out):
    import jax

    return jax.block_until_ready(out)


class Contest:
    """Both contestants for one program, built once (plans and executables warm)."""

    def __init__(self, prog: Program, quick: bool):
        import jax
        import numpy as np
        from jax.sharding import NamedSharding

        import gspmd_py as gp

        self.prog, self.quick = prog, quick
        self.mesh = gp.Mesh(prog.mesh_shape, prog.axis_names)
        self.jmesh = jax.sharding.Mesh(self.mesh.jax_devices(), prog.axis_names)
        self.args = prog.args(quick)
        sizes = dict(zip(prog.axis_names, prog.mesh_shape))
        self.jit_in = tuple(None if s is None else NamedSharding(self.jmesh, even_spec(s, a.shape, sizes))
                            for s, a in zip(prog.in_specs, self.args))
        ref_out = jax.eval_shape(prog.make(lambda x, s: x), *self.args)
        self.jit_out = None if prog.out_specs is None else jax.tree_util.tree_map(
            lambda o: NamedSharding(self.jmesh, even_spec(prog.out_specs, o.shape, sizes)), ref_out)
        self.ours = self.make_ours()
        self.jit = self.make_jit()
        self.plan = self.ours.plan(*self.args)
        self.jit_compiled = self.jit.lower(*self.args).compile()
        # placed inputs: jax.Arrays in the sharding each side's program takes
        self.placed_ours = [jax.device_put(a, NamedSharding(self.plan.jax_mesh, even_spec(s, a.shape, self.plan.fine.size_of)))
                            for a, s in zip(self.args, self.plan.in_specs)]
        self.placed_jit = [jax.device_put(a, s) for a, s in zip(self.args, self.jit_compiled.input_shardings[0])]
        out = _block(self.ours(*self.args))
        ref = _block(self.jit(*self.args))
        self.err = max(float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
                       for u, v in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)))

    def make_ours(self):
        import gspmd_py as gp

        p = self.prog
        return gp.spmd(p.make(gp_constrain), self.mesh, in_shardings=p.in_specs, out_shardings=p.out_specs)

    def make_jit(self):
        import jax

        return jax.jit(self.prog.make(jax_constrain_for(self.jmesh)), in_shardings=self.jit_in,
                       out_shardings=self.jit_out)


def run_program(prog: Program, quick: bool, repeats: int, first_repeats: int) -> CallResult:
    c = Contest(prog, quick)
    res = CallResult(prog.name, prog.title, max_abs_err=c.err)
    args, po, pj = c.args, c.placed_ours, c.placed_jit
    t = interleaved({"numpy_ours": lambda: _block(c.ours(*args)), "numpy_jit": lambda: _block(c.jit(*args)),
                     "placed_ours": lambda: _block(c.ours(*po)), "placed_jit": lambda: _block(c.jit(*pj))},
                    repeats=repeats, mins=res.mins)
    for k, v in t.items():
        setattr(res, k, v)

    def fresh_ours():
        f = c.make_ours()
        return lambda: _block(f(*args))

    def fresh_jit():
        f = c.make_jit()
        return lambda: _block(f(*args))

    t = once_interleaved({"first_ours": fresh_ours, "first_jit": fresh_jit}, repeats=first_repeats)
    res.first_ours, res.first_jit = t["first_ours"], t["first_jit"]
    res.colls_ours = hlo.summarize([(x.kind, x.bytes_per_device) for x in c.plan.collectives])
    res.colls_ours_hlo = hlo.summarize(hlo.hlo_collectives(c.plan.lower().compile().as_text()))
    res.colls_xla = hlo.summarize(hlo.hlo_collectives(c.jit_compiled.as_text()))
    return res


# ------------------------------------------------------------------------------------------
# first call in a fresh process
# ------------------------------------------------------------------------------------------

def _cold_child(name: str, who: str, quick: bool, shapes) -> dict[str, Any]:
    """Runs in the subprocess: warm JAX up on an unrelated program, then time one first call."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    import gspmd_py  # noqa: F401  (import cost is not part of the first call)

    prog = programs()[name]
    jm = jax.sharding.Mesh(__import__("numpy").asarray(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    warm = jax.jit(lambda v: jnp.sin(v) + 1, in_shardings=NamedSharding(jm, PartitionSpec("a", "b")))
    _block(warm(__import__("numpy").ones((8, 8), "float32")))
    c_args = prog.args(quick)
    t0 = time.perf_counter()
    if who == "ours":
        import gspmd_py as gp

        mesh = gp.Mesh(prog.mesh_shape, prog.axis_names)
        f = gp.spmd(prog.make(gp_constrain), mesh, in_shardings=prog.in_specs, out_shardings=prog.out_specs)
        _block(f(*c_args))
    else:
        # the same construction as Contest.make_jit, without building gspmd_py objects first
        import numpy as np

        jmesh = jax.sharding.Mesh(np.asarray(jax.devices()[:int(np.prod(prog.mesh_shape))]).reshape(prog.mesh_shape),
                                  prog.axis_names)
        sizes = dict(zip(prog.axis_names, prog.mesh_shape))
        jin = tuple(None if s is None else NamedSharding(jmesh, even_spec(s, a.shape, sizes))
                    for s, a in zip(prog.in_specs, c_args))
        fn = prog.make(jax_constrain_for(jmesh))
        jout = None if prog.out_specs is None else jax.tree_util.tree_map(
            lambda shape: NamedSharding(jmesh, even_spec(prog.out_specs, shape, sizes)), shapes,
            is_leaf=lambda v: isinstance(v, tuple) and all(isinstance(d, int) for d in v))
        f = jax.jit(fn, in_shardings=jin, out_shardings=jout)
        _block(f(*c_args))
    return {"seconds": time.perf_counter() - t0}


def _tuples(x):
    """JSON lists back to shape tuples (a list of ints is a shape)."""
    if isinstance(x, list) and all(isinstance(d, int) for d in x):
        return tuple(x)
    return [_tuples(v) for v in x] if isinstance(x, list) else x


def out_shapes(prog: Program, quick: bool):
    """The program's output shapes (a pytree of tuples), computed without running it."""
    import jax

    out = jax.eval_shape(prog.make(lambda x, s: x), *prog.args(quick))
    return jax.tree_util.tree_map(lambda o: tuple(o.shape), out)


def cold_first_calls(names: list[str], quick: bool, repeats: int) -> dict[str, dict[str, float]]:
    """Median first-call seconds in fresh processes: {program: {"ours": s, "jit": s}}."""
    import statistics

    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        samples: dict[str, list[float]] = {"ours": [], "jit": []}
        shapes = out_shapes(programs()[name], quick)
        for r in range(repeats):
            for who in (("ours", "jit") if r % 2 == 0 else ("jit", "ours")):
                cmd = [sys.executable, "-m", "benchmarks.calls", name, who, json.dumps(shapes)] + \
                    (["--quick"] if quick else [])
                p = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"cold run {name}/{who} failed:\n{p.stderr[-2000:]}")
                d = json.loads(p.stdout.strip().splitlines()[-1])
                samples[who].append(d["seconds"])
        out[name] = {"ours": statistics.median(samples["ours"]), "jit": statistics.median(samples["jit"])}
    return out


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    shapes = json.loads(sys.argv[3], object_hook=None)
    print(json.dumps(_cold_child(sys.argv[1], sys.argv[2], "--quick" in sys.argv, _tuples(shapes))))
