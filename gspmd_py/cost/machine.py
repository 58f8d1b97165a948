"""The hardware a plan will run on, by default: from the mesh's devices.

``default_hardware(mesh, largest_bytes)`` -> ``(Hardware, text)``, ``text`` saying which and why:

* an abstract mesh (no devices): the ``h100-node`` preset (nothing to measure);
* GPUs / TPUs: the preset of their ``device_kind`` (``KINDS``: "H100" -> h100-node,
  "A100" -> a100-node, "TPU v3" -> tpu-v3, "TPU v4" -> tpu-v4); an accelerator no preset
  names is calibrated as a CPU is;
* CPU devices (and unnamed accelerators): ``Hardware.calibrate(mesh)`` once, cached on disk
  under ``$GSPMD_PY_CACHE_DIR`` (default ``~/.cache/gspmd_py``), keyed by the machine (host,
  CPU count, platform, device kind), the mesh (shape, axis names, device ids), the jax
  version, the largest collective size measured and the cache's ``FORMAT`` (bumped when
  calibration measures more: an older entry is measured again, as is one lacking a field). Collectives are measured up to the
  size the program moves (``largest_bytes``, at most ``MAX_COLLECTIVE_BYTES``): the cost
  model extrapolates past the largest size it measured, and large transfers are where a
  host's links leave their alpha-beta line. Sizes above 2 MiB are time-bounded
  (calibrate.LARGE_BUDGET_S per round): a slow host measures fewer of them.

``CALIBRATION`` holds the calibration's settings (tests shrink them).
"""
from __future__ import annotations

import hashlib
import logging
import os
import pickle
import platform
from typing import Optional

import attrs
import jax

from ..core.mesh import Mesh
from .hardware import Hardware

KINDS = (("h100", "h100-node"), ("a100", "a100-node"), ("tpu v3", "tpu-v3"), ("tpu v4", "tpu-v4"))
BASE_SIZES = (2 ** 14, 2 ** 17, 2 ** 21)
MAX_COLLECTIVE_BYTES = 2 ** 25  # 32 MiB per device: larger transfers extrapolate from here
CALIBRATION = {"reps": 5, "base_sizes": BASE_SIZES, "max_bytes": MAX_COLLECTIVE_BYTES}
log = logging.getLogger("gspmd_py.calibrate")
FORMAT = 3  # bump when the cached Hardware's layout or what calibration measures changes (2: per-class rates,
# 3: weight-gradient conv classes)


def cache_dir() -> str:
    return os.environ.get("GSPMD_PY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "gspmd_py")


def collective_sizes(largest_bytes: Optional[int]) -> tuple[int, ...]:
    """The base sizes, then powers of 4 up to ``largest_bytes`` (at most ``max_bytes``)."""
    sizes = list(CALIBRATION["base_sizes"])
    top = min(int(largest_bytes or 0), int(CALIBRATION["max_bytes"]))
    b = sizes[-1] * 4
    while b <= top * 2 and b <= CALIBRATION["max_bytes"]:
        sizes.append(b)
        b *= 4
    return tuple(sizes)


def preset_for(kind: str) -> Optional[str]:
    k = kind.lower()
    return next((name for key, name in KINDS if key in k), None)


def _key(mesh: Mesh, sizes, reps: int) -> str:
    dev = mesh.jax_devices().reshape(-1)
    parts = (FORMAT, platform.node(), os.cpu_count(), dev[0].platform, dev[0].device_kind, tuple(mesh.shape),
             tuple(mesh.axis_names), tuple(int(i) for i in mesh.device_ids.reshape(-1)), jax.__version__,
             tuple(sizes), reps)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def calibrated(mesh: Mesh, largest_bytes: Optional[int] = None) -> tuple[Hardware, str]:
    """This machine over ``mesh``, measured once and cached on disk (see the module docstring)."""
    sizes = collective_sizes(largest_bytes)
    reps = int(CALIBRATION["reps"])
    path = os.path.join(cache_dir(), f"hardware-{_key(mesh, sizes, reps)}.pkl")
    try:
        with open(path, "rb") as fh:
            hw = pickle.load(fh)
        if current(hw):
            return hw, f"calibrated on this machine (cached: {path})"
    except Exception:  # noqa: BLE001 - a missing, stale or broken cache entry is measured again
        pass
    # a one-time pause of seconds to a minute: said even where logging is not configured (a
    # warning reaches stderr by default; INFO progress lines follow once logging shows them)
    log.warning("measuring this machine over %s for the cost model, once (10-60 s; cached under %s; "
                "hardware=gp.Hardware.preset(...) skips it)", mesh, cache_dir())
    hw = Hardware.calibrate(mesh, sizes=sizes, reps=reps, name="calibrated")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(hw, fh)
        os.replace(tmp, path)
        where = f"cached in {path}"
    except OSError as e:
        where = f"not cached: {e}"
    return hw, f"calibrated on this machine just now, collectives up to {sizes[-1] // 2 ** 20} MiB ({where})"


def current(hw) -> bool:
    """Is ``hw`` (unpickled from the cache) a Hardware with every field this version has? An
    entry written before a field was added lacks it, and is measured again."""
    return isinstance(hw, Hardware) and all(hasattr(hw, f.name) for f in attrs.fields(Hardware))


def default_hardware(mesh: Mesh, largest_bytes: Optional[int] = None) -> tuple[Hardware, str]:
    """The hardware ``mesh``'s devices are, and a line saying how it was chosen."""
    if mesh.is_abstract:
        return Hardware.preset("h100-node"), "h100-node preset (an abstract mesh has no devices to measure)"
    dev = mesh.jax_devices().reshape(-1)[0]
    if dev.platform != "cpu":
        name = preset_for(dev.device_kind)
        if name is not None:
            return Hardware.preset(name), f"{name} preset (the mesh's devices are {dev.device_kind})"
    hw, how = calibrated(mesh, largest_bytes)
    return hw, f"{dev.platform} devices ({dev.device_kind}) {how}"
