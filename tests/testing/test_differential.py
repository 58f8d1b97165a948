"""The differential mode: gp.spmd against jax.jit with the same NamedShardings (XLA's own
partitioner) over a small corpus of random programs (gpt.programs), ints and float32 with plain
values (XLA's max/min all-reduces drop NaN and its float16 partial sums overflow: those
differences are XLA's, reported separately, not gp's)."""
import numpy as np

import gspmd_py as gp
import gspmd_py.testing as gpt


def test_random_programs_match_jax_jit():
    progs = gpt.programs(dtypes=("float32", "int32"), values=("plain",))
    gpt.assert_spmd_equivalent(progs, reference="jax.jit", max_examples=8)


def test_user_function_matches_jax_jit_with_sub_axes():
    x = gpt.fill((7, 12), np.float32, 0)
    gpt.assert_spmd_equivalent(lambda x: (x.T @ x, x.sum(0)), x, mesh=gp.Mesh((2, 4), ("x", "y")),
                               in_shardings=(gp.P("y:(2)2", ("x", "y:(1)2")),), reference="jax.jit", max_examples=4)
