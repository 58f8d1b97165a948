"""Arguments as jax.jit takes them: static_argnums/static_argnames (the plan cache keyed on their
values), keyword arguments, donate_argnums, weak-typed Python scalars, wrapped callables;
and a clear gp.ArgumentError, naming the argument by its key path, for what cannot be one."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import assert_same, mesh_of, rand

P = gp.P


@pytest.fixture(scope="module")
def mesh():
    return mesh_of(1)


@pytest.mark.slow
def test_static_and_keyword_arguments(mesh):
    def fn(x, n, *, act="tanh", scale=1.0):
        return getattr(jnp, act)(x[:n]) * scale + jnp.ones((n, x.shape[1]))  # n is used as a shape

    f = gp.spmd(fn, mesh, in_shardings=(P("x", None),), static_argnums=1, static_argnames="act")
    x = rand((8, 6))
    assert_same(f(x, 4, act="sin", scale=2.0), fn(x, 4, act="sin", scale=2.0))
    assert_same(f(x, 5, scale=np.float32(3.0)), fn(x, 5, scale=3.0))
    assert_same(f(x, n=3), fn(x, 3))  # a static position passed by name is static too
    assert len(f._entries) == 3  # one plan per static value (and argument structure)
    f(x, 4, act="sin", scale=7.0)
    assert len(f._entries) == 3  # same static values and shapes: the cached plan
    # keyword argument leaves reach the plan, open to propagation
    assert f.plan(x, 4, scale=2.0).in_shardings[0][0] == gp.Sharding(mesh, P("x", None))
    # under jax.jit the statics are the jit's statics too
    jf = jax.jit(f, static_argnums=1, static_argnames="act")
    assert_same(jf(x, 6, act="sin", scale=0.5), fn(x, 6, act="sin", scale=0.5))
    with pytest.raises(gp.ArgumentError, match=r"static argument arg1 is traced.*static there too"):
        jax.jit(f)(x, 2)


def test_keyword_arguments_and_in_shardings(mesh):
    f = gp.spmd(lambda x, w: x @ w, mesh, in_shardings=(P("x", None), P(None, "y")))
    x, w = rand((8, 4)), rand((4, 8))
    assert_same(f(x, w=w), x @ w)  # a keyword naming a positional parameter is that parameter
    assert f.plan(x=x, w=w) is f.plan(x, w)
    assert f.plan(x, w=w).in_shardings[1] == gp.Sharding(mesh, P(None, "y"))
    g = gp.spmd(lambda x, **kw: x @ kw["w"], mesh, in_shardings=(P("x", None), P(None, "y")))
    with pytest.raises(gp.ArgumentError, match=r"keyword arguments \(w\) take none.*positionally"):
        g(x, w=w)
    assert_same(gp.spmd(lambda x, **kw: x @ kw["w"], mesh, in_shardings=(P("x", None),))(x, w=w), x @ w)


def test_disable_jit_runs_the_plain_function(mesh):
    f = gp.spmd(lambda x: gp.annotate(x * 2.0, P("x")), mesh)
    with jax.disable_jit():
        out = jax.jit(f)(np.arange(8.0, dtype=np.float32))
    assert_same(out, np.arange(8.0, dtype=np.float32) * 2.0)


def test_python_scalars_are_weakly_typed(mesh):
    f = gp.spmd(lambda a, s: a * s, mesh, in_shardings=(P("x"), None))
    a = np.arange(8, dtype=np.int8)
    got = f(a, 3)
    assert got.dtype == jax.jit(lambda a, s: a * s)(a, 3).dtype == np.int8
    assert_same(got, (a * np.int8(3)).astype(np.int8))


def test_donated_arguments(mesh):
    f = gp.spmd(lambda x, y: x * 2.0 + y, mesh, in_shardings=(P("x", "y"), P("x", "y")), out_shardings=P("x", "y"),
                donate_argnums=0)
    x = rand((8, 8))
    a = f(x, x)  # laid out as the plan wants: the next call consumes it
    b = f(a, x)
    assert a.is_deleted()
    assert_same(b, x * 7.0)
    assert "tf.aliasing_output" in f.plan(x, x).lower_text()
    with pytest.raises(gp.ArgumentError, match="both static and donated"):
        gp.spmd(lambda x: x, mesh, static_argnums=0, donate_argnums=0)
    with pytest.raises(gp.ArgumentError, match=r"static_argnums \[3\] out of range"):  # as jax.jit
        gp.spmd(lambda x: x, mesh, static_argnums=3)
    gp.spmd(lambda *xs: xs[0], mesh, static_argnums=3)  # *args: any position may come


class _FilterJitLike:
    """A wrapper whose __dict__ holds a field named like Spmd's own attributes (eqx.filter_jit's "fn")."""

    def __init__(self, fn):
        self.fn = "not callable"
        self.mesh = None
        self._wrapped = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *a):
        return self._wrapped(*a)


def test_wrapped_callables_keep_the_spmd_attributes(mesh):
    f = gp.spmd(_FilterJitLike(lambda x: x * 2.0), mesh, in_shardings=P("x", None))
    x = rand((8, 4))
    assert_same(f(x), x * 2.0)
    assert f.mesh is mesh and f.__name__ == "<lambda>"


def test_a_method_binds_its_instance_as_jax_jit_does(mesh):
    """@gp.spmd on a method: the instance is arg0 (static here; a pytree instance works too)."""
    class Scale:
        def __init__(self, k):
            self.k = k

        def __hash__(self):
            return hash(self.k)

        def __eq__(self, other):
            return isinstance(other, Scale) and other.k == self.k

        @functools.partial(gp.spmd, mesh=mesh, in_shardings=(P("x", None),), static_argnums=0)
        def __call__(self, x):
            return x * self.k

    x = rand((8, 4))
    assert_same(Scale(3.0)(x), x * 3.0)
    assert_same(jax.grad(lambda v: Scale(2.0)(v).sum())(x), np.full_like(x, 2.0))
    assert isinstance(Scale.__call__, gp.Spmd)  # looked up on the class: the function itself


def test_equinox_filter_jit_both_ways(mesh):
    eqx = pytest.importorskip("equinox")
    x = rand((8, 4))
    inner = gp.spmd(eqx.filter_jit(lambda v: v * 2.0), mesh, in_shardings=P("x", None))
    assert_same(inner(x), x * 2.0)
    outer = eqx.filter_jit(gp.spmd(lambda v, k: v * k, mesh, in_shardings=(P("x", None), None)))
    assert_same(outer(x, 3.0), x * 3.0)


@pytest.mark.parametrize("call, message", [
    (lambda f: f(jax.ShapeDtypeStruct((8, 4), jnp.float32), 1), r"argument arg0 is a jax.ShapeDtypeStruct.*f.plan"),
    (lambda f: f(rand((8, 4)), [1]), r"static argument arg1 is a list, which is not hashable"),
    (lambda f: f(rand((8, 4)), 1, scale=2 ** 40), r"argument scale = 1099511627776 does not fit int32"),
    (lambda f: f({"a": rand((8, 4)), "b": [rand((8, 4)), "relu"]}, 1),
     r"argument arg0\['b'\]\[1\] is str 'relu', not an array: mark it static"),
    (lambda f: f(rand((8, 4)), 1, scale=print), r"argument scale is builtin_function_or_method .*eqx.partition"),
])
def test_argument_errors_name_the_argument(mesh, call, message):
    def fn(x, n, scale=1.0):
        return jax.tree_util.tree_leaves(x)[0] * n * scale

    f = gp.spmd(fn, mesh, static_argnums=1)
    with pytest.raises(gp.ArgumentError, match=message) as e:
        call(f)
    assert len(str(e.value)) < 300
