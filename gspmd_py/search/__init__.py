"""The search over shardings, below the compiler: gp.tactics (tactics.py; compiler.seed runs them),
the context they decide in, pricing, actions, the optimizer.  Its user entry points, gp.auto_shard
and gp.rank_meshes, sit above gp.spmd in gspmd_py/api/."""
