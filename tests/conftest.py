"""Test setup: 8 CPU devices (set before jax is imported), the compiler's verifier between
passes (``GSPMD_PY_VERIFY=1``) and hypothesis profiles.

Profiles: "ci" (default, keeps CI fast), "fuzz" (2,000 examples per property, or N with
``GSPMD_PY_FUZZ=N`` for N > 1). Select with ``GSPMD_PY_FUZZ=1`` or ``--hypothesis-profile=fuzz``.
"""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# the compiler checks its invariants between passes (gspmd_py/views/pass_check.py)
os.environ.setdefault("GSPMD_PY_VERIFY", "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=12, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
_FUZZ = os.environ.get("GSPMD_PY_FUZZ", "")
settings.register_profile(
    "fuzz", max_examples=int(_FUZZ) if _FUZZ.isdigit() and int(_FUZZ) > 1 else 2000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.load_profile("fuzz" if _FUZZ else "ci")


@pytest.fixture(scope="module")
def mesh():
    """The (2, 4) mesh ("x", "y") most tests plan on."""
    import gspmd_py as gp

    return gp.Mesh((2, 4), ("x", "y"))
