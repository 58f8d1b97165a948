"""gspmd_py: annotate a few tensors of a JAX function, get ONE SPMD program.

    import gspmd_py as gp
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))
    out = f(x, w)               # global jax.Arrays, laid out as planned
    print(f.plan(x, w).report())
"""
from .core.errors import (AnnotationError, ArgumentError, DeletedArrayError, MeshError, PartitionWarning, ShardingError,
                          HardwareError, SpecError, TileAssignmentError, UnsupportedOpError)
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



def __getattr__(name: str):
    """``gp.testing`` is imported on first use (it imports hypothesis; ``import gspmd_py`` does not)."""
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module 'gspmd_py' has no attribute {name!r}")


__all__ = [
    "AnnotationError", "ArgumentError", "AutoResult", "AxisRef", "DeletedArrayError", "Collective", "Cost", "Hardware",
    "Link", "MemoryLimitError", "Plan", "ProgramMismatchError", "Rules", "Schedule", "TacticError", "auto_shard",
    "pipeline", "tactics",
    "distributed", "to_host", "Spmd", "rules", "spmd", "Mesh", "MeshError", "P", "PartitionWarning", "Sharding",
    "ShardingError", "HardwareError", "Placement", "rank_meshes",
    "SpecError", "TileAssignmentError", "UnsupportedOpError", "annotate", "mesh_split", "tag",
]
