"""The core: the values and seams every layer uses; it imports nothing else of the package.

Its inner order, bottom to top (``CORE_ORDER`` in tests/core/test_structure.py keeps it: a module
imports only modules of a lower step):

1. ``errors`` (gp.ShardingError and its subclasses), ``dtypes`` (dtype classes and reduction identities),
   ``jax_compat`` (every JAX private API the package touches), ``launch_env`` (the environment
   ``python -m gspmd_py.launch`` sets, and the hint a mesh error gives a launched process);
2. ``mesh`` (gp.Mesh, mesh sub-axes), ``ir`` (the SSA graph of Values and Ops the passes read);
3. ``sharding`` (gp.P, gp.Sharding), ``fine_mesh`` (the execution mesh: every axis split at the
   sub-axes a plan uses, and the device groups of a collective over it).
"""
