"""What users call above the compiler: ``gp.spmd`` (api.py; primitive.py makes it a JAX
primitive, arguments.py reads its arguments as jax.jit does), ``gp.auto_shard`` (auto.py) and
``gp.rank_meshes`` (placement.py).  The top layer: it imports the compiler and everything below it;
nothing in the package imports it (but the package's ``__init__``).  Layers, bottom to top: core,
ops, frontend, propagation, program, cost, partitioner, runtime, search, views, plan,
compiler, api (LAYERS in tests/core/test_structure.py keeps the folders a DAG; docs/architecture.md
says what each room holds)."""
