"""Bad inputs, red team 5: user mistakes that used to end in an internal traceback (AttributeError,
TypeError, a raw re/ValueError), a crash of the process, or silence, are now a gp.ShardingError
subclass naming the culprit. One table: (mistake, the error class, words its message must hold)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import gspmd_py as gp

P = gp.P
M24 = gp.Mesh((2, 4), ("x", "y"))
X = np.ones((8, 8), np.float32)


def _static_argname_not_a_parameter():
    gp.spmd(lambda a, n: a * n, M24, static_argnames=("nn",))


CASES = [
    ("static_argnames naming no parameter", _static_argname_not_a_parameter, gp.ArgumentError,
     ["static_argnames ['nn']", "name no parameter", "['a', 'n']"]),
]


@pytest.mark.parametrize("mistake, fn, error, needles", CASES, ids=[c[0] for c in CASES])
def test_mistake_is_a_clear_error(mistake, fn, error, needles):
    assert issubclass(error, gp.ShardingError)
    with pytest.raises(error, match=".*".join(map(re.escape, needles))):
        fn()


def test_static_argnames_of_a_keyword_only_or_var_keyword_function_are_taken():
    """Names the function takes (keyword-only ones), and any name where it has **kwargs, stay accepted."""
    f = gp.spmd(lambda a, *, act: a * act, M24, static_argnames=("act",))
    np.testing.assert_allclose(f(X, act=2.0), X * 2)
    g = gp.spmd(lambda a, **kw: a * kw["k"], M24, static_argnames=("k",))
    np.testing.assert_allclose(g(X, k=3.0), X * 3)
