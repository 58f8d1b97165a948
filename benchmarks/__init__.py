"""``python -m benchmarks``: gspmd_py against jax.jit (see __main__.py)."""
