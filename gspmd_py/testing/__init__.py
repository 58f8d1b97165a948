"""gp.testing: property-based checks of your own sharded programs (needs ``hypothesis``:
``pip install gspmd_py[testing]``)::

    import gspmd_py.testing as gpt            # also gp.testing (imported on first use)
    gpt.assert_spmd_equivalent(fn, x, w)      # gp.spmd(fn) == fn over drawn meshes, shardings, shapes, values
    gpt.assert_spmd_equivalent(fn, x, w, reference="jax.jit")   # ... == XLA's partitioner, same shardings
    gpt.assert_plan(fn, x, w, mesh=gp.Mesh.abstract((64, 128), ("x", "y")), in_shardings=specs,
                    no_fallback=True, max_collective_bytes=2**30)   # nothing runs
    gpt.meshes(), gpt.shardings(shape, mesh), gpt.shapes_like(args), gpt.values(dtype), gpt.arrays(shape, dtype)
    gpt.programs()                            # random small programs (the project's own fuzzer)
    gpt.assert_annotation_invariant(...), gpt.assert_device_order_invariant(...), gpt.assert_deterministic(...)
    # conftest.py:  pytest_plugins = ["gspmd_py.testing.pytest_plugin"]   (8 CPU devices, the spmd_mesh fixture)

Modules: strategies.py (meshes, shardings, shapes, values), compare.py (what must be exact, the
float tolerance), equivalence.py (the assertion), reproducer.py (failure scripts), plan_checks.py
(assert_plan, check_plan), metamorphic.py, programs.py (random programs), pytest_plugin.py.
"""
try:
    import hypothesis  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("gspmd_py.testing needs hypothesis: pip install 'gspmd_py[testing]'") from e

from .compare import EXACT, EXACT_UP_TO_ZERO_SIGN, INEXACT, analyze
from .equivalence import Case, apply_mode, assert_spmd_equivalent, check_case, compare_trees, jit_reference
from .metamorphic import assert_annotation_invariant, assert_deterministic, assert_device_order_invariant
from .plan_checks import assert_plan, check_plan
from .programs import Program, programs
from .pytest_plugin import ensure_host_devices
from .reproducer import script as reproducer_script
from .strategies import Annotation, annotations, arrays, fill, meshes, shapes_like, shardings, special_values, values

__all__ = [
    "Annotation", "Case", "EXACT", "EXACT_UP_TO_ZERO_SIGN", "INEXACT", "Program", "analyze", "annotations",
    "apply_mode", "arrays", "assert_annotation_invariant", "assert_deterministic", "assert_device_order_invariant",
    "assert_plan", "assert_spmd_equivalent", "check_plan", "check_case", "compare_trees", "ensure_host_devices", "fill",
    "jit_reference", "meshes", "programs", "reproducer_script", "shapes_like", "shardings", "special_values", "values",
]
