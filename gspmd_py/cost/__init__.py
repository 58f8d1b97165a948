"""The cost model: ``gp.Hardware`` (presets, calibration) and ``plan.cost(hw)`` -> ``gp.Cost``.

    hw = gp.Hardware.preset("h100-node")     # or "tpu-v3", "tpu-v4", "a100-node"; gp.Hardware.calibrate(mesh)
    c = plan.cost(hw)                         # works on gp.Mesh.abstract plans too
    cost(plan.cost_input(), hw)               # the same: the model reads a CostInput (index, mesh, donations)
    c.step_s, c.flops, c.comm_bytes, c.peak_memory_bytes
    print(c.table())                          # the ops with the largest predicted time

Modules: hardware.py (Hardware, Link, topologies, presets), collectives.py (alpha-beta
times), counting.py (FLOPs per equation), fusion.py (which values reach memory),
memory.py (liveness), model.py (the walk, Cost), calibrate.py (measuring this machine).
"""
from .hardware import GiB, Hardware, Level, Link, PerAxis, Switched, Torus
from .model import CollectiveCost, Cost, CostInput, OpCost, cost

__all__ = ["CollectiveCost", "Cost", "CostInput", "GiB", "Hardware", "Level", "Link", "OpCost", "PerAxis", "Switched", "Torus",
           "cost"]
