"""assert_spmd_equivalent reuses what repeats between examples (issue 39): the traced computation
(gradients included) once per input shapes, gp.spmd's plan once per mesh, shardings and shapes,
the reference once per input; a user's budget buys examples, not retraces."""
import jax.numpy as jnp
import numpy as np

import gspmd_py as gp
import gspmd_py.testing as gpt


def test_traces_once_per_shape_not_once_per_example():
    calls = {"fn": 0}

    def fn(x, w):
        calls["fn"] += 1
        return jnp.tanh(x @ w).sum(0)

    mesh = gp.Mesh((2,), ("x",))
    gpt.assert_spmd_equivalent(fn, np.zeros((8, 4), np.float32), np.zeros((4, 3), np.float32), mesh=mesh,
                               in_shardings=(gp.P("x", None), None), vary_shapes=False,
                               value_modes=("plain",), max_examples=15, seed=0, also_grad=True)
    # fn is traced for the comparison once per mode, by gp.spmd's plans (value, grad), by the
    # reference's jit and the argument check; not once per example and mode (30)
    assert calls["fn"] <= 10, calls
