"""Sphinx configuration of gspmd_py's documentation (MyST Markdown pages, autodoc API).

Build: ``python -m pip install -e ".[docs]" && python -m sphinx -W -b html docs docs/_build``
(tests/core/test_docs.py builds it the same way when Sphinx is installed).
"""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

project = "gspmd_py"
author = "gspmd_py authors"
copyright = "gspmd_py authors"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "none"
html_theme = "alabaster"
