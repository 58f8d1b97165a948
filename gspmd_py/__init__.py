"""gspmd_py: annotate a few tensors of a JAX function, get ONE SPMD program.

    import gspmd_py as gp
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    out = f(x, w)               # global jax.Arrays, laid out as planned
    print(f.plan(x, w).report())

The public names are imported on first use (PEP 562), so ``import gspmd_py`` and
``python -m gspmd_py --help`` do not import JAX; ``gp.Mesh`` (or any other name) does.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, imported for type checkers and readers
    from .core.errors import (AnnotationError, ArgumentError, DeletedArrayError, MeshError, PartitionWarning,
                         ShardingError, HardwareError, SpecError, TileAssignmentError, UnsupportedOpError)
    from .core.mesh import AxisRef, Mesh
    from .core.sharding import P, Sharding
    from .frontend.annotate import annotate, mesh_split, tag
    from .api.api import Plan, Spmd, spmd
    from .frontend.rules import Rules, rules
    from .frontend.pipeline import Schedule, pipeline
    from .program.collective import Collective
    from .cost import Cost, Hardware, Link
    from .api.placement import Placement, rank_meshes
    from .runtime import distributed
    from .runtime.distributed import to_host
    from .runtime.plancheck import ProgramMismatchError
    from .search import tactics
    from .api.auto import AutoResult, auto_shard
    from .search.optimizer import MemoryLimitError
    from .search.tactics import TacticError

# public name -> the module that defines it (a name that is a module itself: None)
_HOME = {
    **dict.fromkeys(("AnnotationError", "ArgumentError", "DeletedArrayError", "MeshError", "PartitionWarning",
                     "ShardingError", "HardwareError", "SpecError", "TileAssignmentError", "UnsupportedOpError"),
                    ".core.errors"),
    "AxisRef": ".core.mesh", "Mesh": ".core.mesh", "P": ".core.sharding", "Sharding": ".core.sharding",
    "annotate": ".frontend.annotate", "mesh_split": ".frontend.annotate", "tag": ".frontend.annotate",
    "Plan": ".api.api", "Spmd": ".api.api", "spmd": ".api.api",
    "Rules": ".frontend.rules", "rules": ".frontend.rules",
    "Schedule": ".frontend.pipeline", "pipeline": ".frontend.pipeline",
    "Collective": ".program.collective",
    "Cost": ".cost", "Hardware": ".cost", "Link": ".cost",
    "Placement": ".api.placement", "rank_meshes": ".api.placement",
    "to_host": ".runtime.distributed", "ProgramMismatchError": ".runtime.plancheck",
    "AutoResult": ".api.auto", "auto_shard": ".api.auto",
    "MemoryLimitError": ".search.optimizer", "TacticError": ".search.tactics",
}
# public names that are modules
_MODULES = {"distributed": ".runtime.distributed", "tactics": ".search.tactics", "testing": ".testing"}


def _version() -> str:
    """The installed distribution's version (setup.cfg's, the one source); from a source tree
    that was never installed, setup.cfg itself."""
    from importlib import metadata

    try:
        return metadata.version("gspmd_py")
    except metadata.PackageNotFoundError:
        import configparser
        import pathlib

        cfg = configparser.ConfigParser()
        cfg.read(pathlib.Path(__file__).resolve().parent.parent / "setup.cfg")
        return cfg.get("metadata", "version", fallback="0+unknown")


def __getattr__(name: str):
    """A public name, imported on first use (``gp.testing`` imports hypothesis)."""
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name], __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name], __name__)
    elif name == "__version__":
        value = _version()
    else:
        raise AttributeError(f"module 'gspmd_py' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | {"__version__", "testing"})


__all__ = [
    "AnnotationError", "ArgumentError", "AutoResult", "AxisRef", "DeletedArrayError", "Collective", "Cost", "Hardware",
    "Link", "MemoryLimitError", "Plan", "ProgramMismatchError", "Rules", "Schedule", "TacticError", "auto_shard",
    "pipeline", "tactics",
    "distributed", "to_host", "Spmd", "rules", "spmd", "Mesh", "MeshError", "P", "PartitionWarning", "Sharding",
    "ShardingError", "HardwareError", "Placement", "rank_meshes",
    "SpecError", "TileAssignmentError", "UnsupportedOpError", "annotate", "mesh_split", "tag",
]
