"""Sharding propagation (completion): see engine.py."""
from .engine import Propagation, Seed

__all__ = ["Propagation", "Seed"]
