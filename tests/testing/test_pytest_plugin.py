"""The pytest plugin: a fresh pytest process without XLA_FLAGS gets 8 CPU devices and runs a test
once per mesh of the spmd_meshes marker (or the default four meshes)."""
import os
import subprocess
import sys
import textwrap

CONFTEST = 'pytest_plugins = ["gspmd_py.testing.pytest_plugin"]\n'
TEST = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import numpy as np
    import pytest

    import gspmd_py as gp


    def test_default_meshes(spmd_mesh):
        assert len(jax.devices()) == 8 and spmd_mesh.size == 8
        x = np.arange(24, dtype=np.float32).reshape(3, 8)
        y = gp.spmd(lambda a: jnp.sum(a, 1), spmd_mesh, in_shardings=(gp.P(None, "x"),))(x)
        np.testing.assert_array_equal(np.asarray(y), x.sum(1))


    @pytest.mark.spmd_meshes((2,), (2, 2), names=("data", "model"))
    def test_marked_meshes(spmd_mesh):
        assert spmd_mesh.axis_names[0] == "data" and spmd_mesh.size in (2, 4)
''')


def test_plugin_sets_devices_and_parametrizes(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_user.py").write_text(TEST)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTEST_ADDOPTS")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    for case in ("test_default_meshes[8]", "test_default_meshes[2x4]", "test_default_meshes[4x2]",
                 "test_default_meshes[2x2x2]", "test_marked_meshes[2]", "test_marked_meshes[2x2]"):
        assert case + " PASSED" in out, out[-3000:]
