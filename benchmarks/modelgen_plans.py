"""Hand plans for any generated model (benchmarks/modelgen.py), built from its parameters' roles.

``hand_plans(model, mesh)`` -> {plan name: gp.spmd keyword arguments}: the plan families a
practitioner applies to a model (issue 37 item 5), whatever its blocks:

* replicated; data parallel over every axis;
* FSDP / ZeRO-3: ``gp.tactics.batch`` on the data and ``gp.tactics.zero`` on params and
  optimizer state, over every axis;
* Megatron over every axis: the column / row weights of each pair split on their outer /
  inner dim, the embedding on its vocabulary rows, the output projection on its vocabulary
  columns, experts' hidden dims, GQA key / value projections only where their heads divide
  the degree (replicated otherwise); data replicated;
* on a 2-D mesh, data parallel (x) x Megatron (y);
* sequence parallel (the data's sequence dim split) where the model allows it (no recurrence,
  segment pooling, image stem or pooled head), with the batch over x on a 2-D mesh;
* expert parallel where the model has experts: the expert dim over every axis (and over y
  with data over (x, y) on a 2-D mesh), data batch-split.

The optimizer state (Adam's m and v) is laid out as the params it belongs to.
"""
from __future__ import annotations

import jax

import gspmd_py as gp

from .modelgen import Model
from .modelgen import Role

P = gp.P


def _path(kp) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp)


def megatron_spec(role: Role, ndim: int, ax, degree: int):
    """The tensor-parallel spec of a weight with ``role`` over ``ax`` (``degree`` devices); None: replicated."""
    lead = (None,) * role.lead
    kind = role.kind
    if kind == "kv":
        kind = "col" if role.heads % degree == 0 else "rep"
    if kind == "col":
        return P(*lead, None, ax)
    if kind == "row":
        return P(*lead, ax, None)
    if kind == "vocab_rows":
        return P(ax, None)
    if kind == "vocab_cols":
        return P(None, ax)
    if kind == "expert_col":
        return P(*lead, None, None, ax)
    if kind == "expert_row":
        return P(*lead, None, ax, None)
    return None


def expert_spec(role: Role, ndim: int, ax):
    lead = (None,) * role.lead
    return P(*lead, ax, None, None) if role.kind in ("expert_col", "expert_row") else None


def _param_specs(model: Model, rule) -> tuple:
    """Specs of the params (and optimizer state) arguments: ``rule(role, leaf)`` per leaf."""
    def one(tree):
        return jax.tree_util.tree_map_with_path(
            lambda kp, a: rule(model.roles[_path(kp)], a) or P(*([None] * a.ndim)), tree)

    out = [one(model.args[0])]
    if len(model.params) == 2:
        out.append({k: one(v) for k, v in model.args[1].items()})
    return tuple(out)


def _data_specs(model: Model, batch=None, seq=None) -> tuple:
    """Specs of the data arguments: dim 0 over ``batch``, dim 1 (where a sequence) over ``seq``."""
    out = []
    for i in model.data:
        a = model.args[i]
        dims = [None] * a.ndim
        dims[0] = batch
        if seq is not None and i in model.seq_data:
            dims[1] = seq
        out.append(P(*dims))
    return tuple(out)


def _specs(model: Model, rule, batch=None, seq=None) -> dict:
    return dict(in_shardings=_param_specs(model, rule) + _data_specs(model, batch, seq))


def _none(role, a):
    return None


def hand_plans(model: Model, mesh: gp.Mesh) -> dict:
    """name -> gp.spmd keyword arguments of each hand plan that applies to ``model`` on ``mesh``."""
    axes = tuple(mesh.axis_names)
    allax = axes if len(axes) > 1 else axes[0]
    tag = ",".join(axes)
    two = len(axes) == 2
    size = dict(zip(axes, mesh.shape))
    plans = {"replicated": _specs(model, _none),
             f"data parallel ({tag})": _specs(model, _none, batch=allax),
             f"FSDP / ZeRO-3 ({tag})": dict(tactics=[gp.tactics.batch(a, argnums=model.data) for a in axes]
                                            + [gp.tactics.zero(a, argnums=model.params) for a in axes]),
             f"Megatron ({tag})": _specs(model, lambda r, a: megatron_spec(r, a.ndim, allax, mesh.size))}
    if two:
        plans["data parallel (x) x Megatron (y)"] = _specs(
            model, lambda r, a: megatron_spec(r, a.ndim, "y", size["y"]), batch="x")
    if model.sequence_ok:
        if two:
            plans["sequence (y) + data parallel (x)"] = _specs(model, _none, batch="x", seq="y")
        else:
            plans[f"sequence ({tag})"] = _specs(model, _none, seq=allax)
    if model.has_experts:
        plans[f"expert parallel ({tag}) + data parallel ({tag})"] = _specs(
            model, lambda r, a: expert_spec(r, a.ndim, allax), batch=allax)
        if two:
            plans["expert parallel (y) + data parallel (x,y)"] = _specs(
                model, lambda r, a: expert_spec(r, a.ndim, "y"), batch=allax)
    return plans
