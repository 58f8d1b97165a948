"""gspmd_py's completed output shardings against the ones JAX's own propagation picks.

For each program, JAX's choice is read from
``jax.jit(fn, in_shardings=...).lower(...).compile().output_shardings``. They agree on
every program here; where gspmd_py deliberately differs a case would say why (none do).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp


def layernorm(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / jnp.sqrt(v + 1e-5)


PROGRAMS = {
    "elementwise_chain": (lambda a, b: jnp.tanh(a) * b + 1, (JP("x", "y"), JP(None, "y")), [(8, 16), (8, 16)]),
    "transpose": (lambda a: a.T * 2, (JP("x", "y"),), [(8, 16)]),
    "broadcast": (lambda a, b: a[:, None, :] + b, (JP("x", None), JP(None, "y", None)), [(8, 16), (8, 4, 16)]),
    "reduce_dim0": (lambda a: a.sum(0), (JP("x", "y"),), [(8, 16)]),
    "reduce_max_dim1": (lambda a: a.max(1), (JP("x", "y"),), [(8, 16)]),
    "batch_dot": (lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), (JP("x", None, None), JP(None, None, "y")),
                  [(4, 8, 16), (4, 16, 8)]),
    "reshape_split": (lambda a: a.reshape(2, 4, 16), (JP("x", None),), [(8, 16)]),
    "reshape_merge": (lambda a: a.reshape(128), (JP("x", None),), [(8, 16)]),
    "concatenate": (lambda a, b: jnp.concatenate([a, b], 1), (JP("x", None), JP("x", None)), [(8, 16), (8, 8)]),
    "softmax": (lambda a: jax.nn.softmax(a, -1), (JP("x", "y"),), [(8, 16)]),
    "layernorm": (layernorm, (JP("x", None),), [(8, 16)]),
    "megatron_mlp": (lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2, (JP("x", None), JP(None, "y"), JP("y", None)),
                     [(8, 16), (16, 32), (32, 16)]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_output_sharding_matches_jax(name):
    fn, ins, shapes = PROGRAMS[name]
    mesh = gp.Mesh((2, 4), ("x", "y"))
    jmesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    compiled = jax.jit(fn, in_shardings=tuple(NamedSharding(jmesh, s) for s in ins)).lower(*avals).compile()
    theirs = compiled.output_shardings
    ours = gp.spmd(fn, mesh, in_shardings=ins).plan(*avals).out_shardings  # accepts jax PartitionSpecs
    assert gp.Sharding(mesh, theirs.spec).with_rank(ours.rank) == ours, (theirs.spec, ours.shardy())
