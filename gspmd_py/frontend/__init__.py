"""The jaxpr importer, below the compiler: ``trace`` (a jaxpr -> ir.Graph), what a user's
function calls inside it (``gp.annotate``/``mesh_split``/``tag``: annotate.py; ``gp.pipeline``:
pipeline.py; JAX's own sharding constraints: constraints.py), and how in/out specs are read
(specs.py, ``gp.rules``: rules.py).  The user API above the compiler is ``gspmd_py/api/``."""
