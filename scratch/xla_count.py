import os, re, sys
os.environ["XLA_FLAGS"]="--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as JP
sys.path.insert(0, "tests")
import gspmd_py as gp
from gspmd_py.demo import transformer_block
P = gp.P
B, T, D, H, K, F = 4, 8, 16, 4, 4, 32
rng = np.random.default_rng(0)
shapes = [((B, T, D), 1.0), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5),
          ((H, K, D), (H * K) ** -0.5), ((D, F), D ** -0.5), ((F, D), F ** -0.5), ((D,), 1.0), ((D,), 1.0)]
args = [(rng.standard_normal(s) * sc).astype(np.float32) for s, sc in shapes]
BLOCK_IN = (P("x", None, None), P(None, "y", None), P(None, "y", None), P(None, "y", None), P("y", None, None),
            P(None, "y"), P("y", None), None, None)
mesh = gp.Mesh((2, 4), ("x", "y"))
g = jax.grad(lambda *a: transformer_block(*a).sum(), argnums=tuple(range(9)))
f = gp.spmd(g, mesh, in_shardings=BLOCK_IN)
plan = f.plan(*args)
for c in plan.collectives: print(c)
print(len(plan.collectives), sum(c.bytes_per_device for c in plan.collectives))
jm = jax.sharding.Mesh(np.array(jax.devices()).reshape(2,4), ("x","y"))
ins = tuple(NamedSharding(jm, JP(*s) if s is not None else JP()) for s in BLOCK_IN)
outs = tuple(NamedSharding(jm, plan.out_shardings[i].spec if hasattr(plan.out_shardings[i], "spec") else JP()) for i in range(9))
hlo = jax.jit(g, in_shardings=ins, out_shardings=outs).lower(*args).compile().as_text()
ops = re.findall(r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(", hlo)
print("XLA:", len(ops), [o[1] for o in ops])
for line in hlo.splitlines():
    if re.search(r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(", line):
        print("   ", line.strip()[:160])
