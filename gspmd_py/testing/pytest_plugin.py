"""A pytest plugin: run a test over several meshes on CPU.

Enable it in your ``conftest.py`` (before anything imports jax there)::

    pytest_plugins = ["gspmd_py.testing.pytest_plugin"]

or on the command line: ``pytest -p gspmd_py.testing.pytest_plugin``. Loading it sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (N from ``--gp-devices``, default 8) and
``JAX_PLATFORMS=cpu`` unless already set: XLA reads the flag once, when jax first creates its
backends, so the plugin must load before any test module touches jax devices. If jax's backends
already started with fewer devices, the ``spmd_mesh`` fixture fails with a message saying so.

Then any test that takes ``spmd_mesh`` runs once per mesh::

    def test_model(spmd_mesh):                    # (8,), (2, 4), (4, 2), (2, 2, 2) by default
        gpt.assert_spmd_equivalent(fn, x, mesh=spmd_mesh, max_examples=10)

    @pytest.mark.spmd_meshes((2,), (2, 2), names=("data", "model"))
    def test_small(spmd_mesh): ...

``ensure_host_devices(n)`` does the environment part for scripts that do not use pytest.
"""
from __future__ import annotations

import os
import sys

DEFAULT_MESHES = ((8,), (2, 4), (4, 2), (2, 2, 2))
DEFAULT_NAMES = ("x", "y", "z", "w")
_FLAG = "--xla_force_host_platform_device_count"


def ensure_host_devices(n: int = 8) -> bool:
    """Ask XLA for ``n`` CPU devices (sets XLA_FLAGS, and JAX_PLATFORMS=cpu when unset). Returns
    False when jax is already imported (then the flag may come too late: check ``jax.devices()``)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG not in flags:
        os.environ["XLA_FLAGS"] = (flags + f" {_FLAG}={n}").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    return "jax" not in sys.modules


def _requested() -> int:
    for part in os.environ.get("XLA_FLAGS", "").split():
        if part.startswith(_FLAG + "="):
            return int(part.split("=", 1)[1])
    return 0


def pytest_addoption(parser):
    parser.addoption("--gp-devices", type=int, default=8,
                     help="CPU devices to ask XLA for (gspmd_py.testing.pytest_plugin; default 8)")


def pytest_configure(config):
    ensure_host_devices(config.getoption("--gp-devices", 8))
    config.addinivalue_line("markers", "spmd_meshes(*shapes, names=None): the meshes the spmd_mesh fixture takes "
                                       "(gspmd_py.testing.pytest_plugin)")


def pytest_generate_tests(metafunc):
    if "spmd_mesh" not in metafunc.fixturenames:
        return
    mark = metafunc.definition.get_closest_marker("spmd_meshes")
    shapes = tuple(tuple(s) for s in mark.args) if mark and mark.args else DEFAULT_MESHES
    names = tuple(mark.kwargs.get("names") or DEFAULT_NAMES) if mark else DEFAULT_NAMES
    params = [(s, names[:len(s)]) for s in shapes]
    metafunc.parametrize("spmd_mesh", params, indirect=True, ids=["x".join(map(str, s)) for s in shapes])


def _spmd_mesh(request):
    import jax
    import pytest

    from ..core.mesh import Mesh

    shape, names = request.param
    need = 1
    for n in shape:
        need *= n
    have = len(jax.devices())
    if have < need:
        pytest.fail(f"mesh {shape} needs {need} devices but jax has {have}: jax started before "
                    f"{_FLAG}={max(need, _requested())} was set. Load gspmd_py.testing.pytest_plugin before "
                    f"anything imports jax (pytest_plugins in the top conftest.py, or -p on the command line), or "
                    f"export XLA_FLAGS={_FLAG}={need}", pytrace=False)
    return Mesh(shape, names)


def _register():
    import pytest

    return pytest.fixture(name="spmd_mesh")(_spmd_mesh)


spmd_mesh = _register() if "pytest" in sys.modules else None
