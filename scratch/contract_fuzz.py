import os, sys, random, traceback
sys.path.insert(0, "tests")
import conftest
import warnings; warnings.simplefilter("ignore")
import jax.numpy as jnp
from hypothesis import given, settings, strategies as st, HealthCheck
import test_contract as T
from partition_util import mesh_of, spec_for, rand, assert_same
import gspmd_py as gp
n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
bad = 0
for name, i in T.CASES:
    fn, shapes = T.SAMPLES[name][i]
    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def run(data):
        mesh = mesh_of(data.draw(st.integers(0, 3)))
        specs = tuple(data.draw(spec_for(mesh, len(s), sub_axes=True)) for s in shapes)
        args = [rand(s, seed=k) for k, s in enumerate(shapes)]
        f = gp.spmd(fn, mesh, in_shardings=specs)
        plan = f.plan(*args)
        v = T.projection_violations(plan)
        assert not v, (specs, v)
        assert_same(f(*args), fn(*map(jnp.asarray, args)), rtol=1e-4, atol=1e-4)
    try:
        run()
        print("ok", name, i, flush=True)
    except Exception as e:
        bad += 1
        print("FAIL", name, i, str(e)[:1500], flush=True)
print("bad", bad)
