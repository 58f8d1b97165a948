"""Mutation testing of the partitioner, the program layer and the index math (issue 39).

Each mutant is one AST edit of one source file, of the kinds partitioner bugs take:

  swap-axes        ``tuple(axes)`` -> reversed; ``axis=d`` / ``dim=d`` keyword -> the other end
  reverse-permute  a 2-tuple ``(a, b)`` built inside a comprehension -> ``(b, a)``
  off-by-one       an integer literal 0, 1, 2 in arithmetic or a comparison -> +1 / -1;
                   ``<`` <-> ``<=``, ``>`` <-> ``>=`` (masks and limits)
  identity         reduce-op strings "sum" <-> "max", "max" <-> "min", "min" <-> "max";
                   ``np.inf`` <-> ``-np.inf``; 0.0 <-> 1.0
  drop-reduce      ``psum(x, ...)`` / ``ctx.all_reduce(x, ...)`` / ``reduce(ctx, pv)`` -> x / pv
  double-reduce    ``ctx.all_reduce(x, ...)`` -> applied twice
  device-order     ``np.arange(n)`` -> ``np.arange(n)[::-1]``; ``+`` <-> ``-`` on an index
  negate           ``if c:`` -> ``if not c:``

The package is copied to a temporary folder per mutant (the worktree is never edited), the
mutated file written there, and the chosen test tier run against it in a worker process that
imports JAX once (``pytest.main`` per mutant, the copy first on ``sys.path``, gspmd_py's
modules and the tier's test modules dropped between mutants). A mutant is killed when a test
fails, errors or the tier runs past ``--timeout``; it survives when the tier passes.

    python tools/mutate.py --list                               # the mutation points, counted by kind
    python tools/mutate.py --sample 120 --seed 0   # stratified: an equal share per kind --report benchmarks/results/mutants.md
    python tools/mutate.py --all --report benchmarks/results/mutants.md       # every point (hours)
    python tools/mutate.py --only gspmd_py/partitioner/partial.py:123:drop-reduce   # one mutant

The tier is the fast tier's tests for the mutated module (``tier_for``: a core of golden text,
the static plan check and the index math, then the module's own tests; ``--tier`` gives one
list of pytest arguments for every mutant instead); ``GSPMD_PY_VERIFY=plan`` is set so every
plan the tier makes is also checked statically (gpt.check_plan).
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("gspmd_py/partitioner", "gspmd_py/program")  # the index math and halo tables live in partitioner/
# the fast tier's tests for each mutated module (not-slow tests only), after a core every mutant
# runs (golden program text, the static plan check, the index math): a mutant of a module runs
# the tests that exercise that module, as coverage-guided mutation tools select them
CORE = ["tests/compiler/test_golden.py", "tests/testing/test_check_plan.py", "tests/partitioner/test_index_math.py"]
_PARTIALS = ["tests/partitioner/test_partial_chains.py", "tests/partitioner/test_partial_forks.py",
             "tests/partitioner/test_partition_reshard.py", "tests/partitioner/test_collective_counts.py"]
_WINDOWS = ["tests/partitioner/test_spatial_windowed.py", "tests/partitioner/test_spatial_conv.py",
            "tests/partitioner/test_shifts.py"]
_LOOPS = ["tests/partitioner/test_control_flow.py", "tests/partitioner/test_loops.py"]
_PROGRAM = ["tests/compiler/test_program_index.py", "tests/compiler/test_compiler.py",
            "tests/compiler/test_pass_check.py"]
SELECT = {
    "collective_matmul": ["tests/partitioner/test_collective_matmul_loops.py",
                          "tests/partitioner/test_hardware_collectives.py"],
    "shaping": ["tests/partitioner/test_hardware_collectives.py"],
    "hierarchy": ["tests/partitioner/test_hardware_collectives.py"] + _PARTIALS,
    "control_handler": _LOOPS, "manual_body": ["tests/partitioner/test_manual_regions.py"],
    "manual_handler": ["tests/partitioner/test_manual_regions.py"],
    "conv_handler": _WINDOWS, "halo": _WINDOWS, "windowed_handler": _WINDOWS, "rotate_handler": _WINDOWS,
    "halo_tables": _WINDOWS, "index_math": _WINDOWS,
    "gather_handler": ["tests/partitioner/test_embedding.py", "tests/partitioner/test_cache_updates.py"],
    "scatter_handler": ["tests/partitioner/test_embedding.py", "tests/partitioner/test_cache_updates.py"],
    "ragged_handler": ["tests/partitioner/test_ragged_dot.py"],
    "random_handler": ["tests/partitioner/test_op_strategies.py"],
    "reshard_plan": ["tests/partitioner/test_reshard_plan.py", "tests/partitioner/test_partition_reshard.py"],
    "program_index": _PROGRAM, "records": _PROGRAM, "collective": _PROGRAM,
    "combine": _PROGRAM + ["tests/partitioner/test_partial_forks.py"], "variadic": _PROGRAM,
    "passes": _PROGRAM, "registry": _PROGRAM, "program": _PROGRAM, "diagnostics": _PROGRAM,
    "fallback": ["tests/frontend/test_plan_errors.py"], "host_calls": ["tests/frontend/test_bad_inputs.py"],
}
DEFAULT = _PARTIALS + ["tests/partitioner/test_spatial_windowed.py"]


def tier_for(path: str) -> list[str]:
    """The tests a mutant of ``path`` runs: the core, then its module's (SELECT, else DEFAULT)."""
    files = CORE + SELECT.get(Path(path).stem, DEFAULT)
    return [f for i, f in enumerate(files) if f not in files[:i]] + ["-m", "not slow"]


REDUCE_SWAP = {"sum": "max", "max": "min", "min": "max"}
REDUCERS = ("psum", "pmax", "pmin", "all_reduce", "psum_scatter", "reduce_scatter")


@dataclass(frozen=True)
class Mutant:
    """One edit: ``path`` (repository-relative), the node's ``line``/``col``, its ``kind``, and
    ``variant`` (which of the node's edits: a literal mutated +1 and -1 is two mutants)."""

    path: str
    line: int
    col: int
    kind: str
    variant: int = 0
    node: str = ""  # the AST node's type and where it ends (a call and its callee start alike)
    end: tuple = ()

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}:{self.col}:{self.kind}" + (f"#{self.variant}" if self.variant else "")


# -- finding the mutation points -------------------------------------------------------------
def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else "")


def _value_arg(node: ast.Call) -> int:
    """The reduced value's position: after ``ctx`` in ``reduce(ctx, pv)`` / ``all_reduce(ctx, x, ...)``."""
    first = node.args[0]
    return 1 if isinstance(first, ast.Name) and first.id == "ctx" and len(node.args) > 1 else 0


def _is_inf(node) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "inf"


def _points(tree: ast.AST) -> Iterator[tuple[ast.AST, str, int]]:
    """(node, kind, variant) for every mutation point of a module, in a fixed order."""
    parents: dict = {}
    for p in ast.walk(tree):
        for c in ast.iter_child_nodes(p):
            parents[c] = p
    in_comp = set()
    for p in ast.walk(tree):
        if isinstance(p, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for c in ast.walk(p):
                in_comp.add(c)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and ast.get_docstring(node):
            pass
        parent = parents.get(node)
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "tuple" and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and "ax" in node.args[0].id:
                yield node, "swap-axes", 0
            if name in REDUCERS and node.args:
                yield node, "drop-reduce", 0
                if name == "all_reduce":
                    yield node, "double-reduce", 0
            if name == "reduce" and len(node.args) == 2:
                yield node, "drop-reduce", 0
            if name == "arange" and len(node.args) == 1 and not isinstance(parent, ast.Subscript):
                yield node, "device-order", 0
            for k, kw in enumerate(node.keywords):
                if kw.arg in ("axis", "dim", "dimension", "scatter_dimension", "split_axis", "concat_axis") and \
                        isinstance(kw.value, (ast.Name, ast.Constant)):
                    yield node, "swap-axes", k + 1
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and node in in_comp and \
                all(isinstance(e, (ast.Name, ast.Call, ast.BinOp)) for e in node.elts) and \
                isinstance(parent, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            yield node, "reverse-permute", 0
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            yield node, "off-by-one", 0
        elif isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1, 2) and \
                isinstance(parent, (ast.BinOp, ast.Compare)):
            yield node, "off-by-one", 1
            yield node, "off-by-one", 2
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in REDUCE_SWAP and \
                not isinstance(parent, ast.Expr):
            yield node, "identity", 0
        elif isinstance(node, ast.Constant) and type(node.value) is float and node.value in (0.0, 1.0):
            yield node, "identity", 1
        elif _is_inf(node):
            yield node, "identity", 2
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)) and \
                any(isinstance(e, ast.Name) and ("idx" in e.id or "index" in e.id or e.id in ("i", "j", "k", "off",
                                                                                                "offset", "lo", "hi"))
                    for e in (node.left, node.right)):
            yield node, "device-order", 1
        elif isinstance(node, ast.If) and not isinstance(node.test, ast.UnaryOp):
            yield node, "negate", 0


def points(path: Path) -> list[Mutant]:
    rel = str(path.relative_to(ROOT))
    tree = ast.parse(path.read_text())
    seen, out = set(), []
    for node, kind, variant in _points(tree):
        m = Mutant(rel, node.lineno, node.col_offset, kind, variant, type(node).__name__,
                   (node.end_lineno, node.end_col_offset))
        if m not in seen:
            seen.add(m)
            out.append(m)
    return out


def all_points() -> list[Mutant]:
    files = []
    for t in TARGETS:
        p = ROOT / t
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return [m for f in files for m in points(f)]


def stratified(pts: list[Mutant], n: int, seed: int) -> list[Mutant]:
    """``n`` mutants: an equal share per kind (all of a kind with fewer), the rest drawn at
    random from what is left; in file order."""
    rng = random.Random(seed)
    kinds = sorted({m.kind for m in pts})
    share = n // max(len(kinds), 1)
    chosen: list[Mutant] = []
    for k in kinds:
        of_kind = [m for m in pts if m.kind == k]
        chosen += rng.sample(of_kind, min(share, len(of_kind)))
    rest = [m for m in pts if m not in set(chosen)]
    chosen += rng.sample(rest, min(n - len(chosen), len(rest)))
    return sorted(chosen, key=lambda m: (m.path, m.line, m.col, m.kind, m.variant))


# -- applying one ----------------------------------------------------------------------------
class _Apply(ast.NodeTransformer):
    def __init__(self, m: Mutant):
        self.m = m
        self.done = False

    def _hit(self, node) -> bool:
        return (getattr(node, "lineno", None), getattr(node, "col_offset", None), type(node).__name__,
                (getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None))) == (
            self.m.line, self.m.col, self.m.node, tuple(self.m.end))

    def visit(self, node):
        node = self.generic_visit(node) or node
        if self.done or not self._hit(node):
            return node
        new = _edit(node, self.m)
        if new is not None:
            self.done = True
            return ast.copy_location(new, node)
        return node


def _edit(node, m: Mutant):
    k, v = m.kind, m.variant
    if k == "swap-axes" and isinstance(node, ast.Call):
        if v == 0 and _call_name(node) == "tuple":
            return ast.Subscript(value=copy.deepcopy(node), slice=ast.Slice(step=ast.Constant(-1)), ctx=ast.Load())
        if v > 0:
            node = copy.deepcopy(node)
            kw = node.keywords[v - 1]
            kw.value = ast.UnaryOp(op=ast.USub(), operand=ast.BinOp(left=kw.value, op=ast.Add(), right=ast.Constant(1)))
            return node
    if k == "reverse-permute" and isinstance(node, ast.Tuple):
        return ast.Tuple(elts=list(reversed(node.elts)), ctx=node.ctx)
    if k == "off-by-one":
        if isinstance(node, ast.Compare):
            flip = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
            return ast.Compare(left=node.left, ops=[flip[type(node.ops[0])]()], comparators=node.comparators)
        if isinstance(node, ast.Constant):
            return ast.Constant(node.value + (1 if v == 1 else -1))
    if k == "identity":
        if v == 0:
            return ast.Constant(REDUCE_SWAP[node.value])
        if v == 1:
            return ast.Constant(1.0 - node.value)
        return ast.UnaryOp(op=ast.USub(), operand=copy.deepcopy(node))
    if k == "drop-reduce" and isinstance(node, ast.Call):
        return copy.deepcopy(node.args[_value_arg(node)])
    if k == "double-reduce" and isinstance(node, ast.Call):
        inner = copy.deepcopy(node)
        outer = copy.deepcopy(node)
        outer.args[_value_arg(node)] = inner
        return outer
    if k == "device-order":
        if isinstance(node, ast.Call):
            return ast.Subscript(value=copy.deepcopy(node), slice=ast.Slice(step=ast.Constant(-1)), ctx=ast.Load())
        if isinstance(node, ast.BinOp):
            return ast.BinOp(left=node.left, op=ast.Sub() if isinstance(node.op, ast.Add) else ast.Add(),
                             right=node.right)
    if k == "negate" and isinstance(node, ast.If):
        node = copy.copy(node)
        node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        return node
    return None


def mutated_source(m: Mutant, base: Path = ROOT) -> Optional[str]:
    src = (base / m.path).read_text()
    tree = ast.parse(src)
    t = _Apply(m)
    tree = t.visit(tree)
    if not t.done:
        return None
    ast.fix_missing_locations(tree)
    out = ast.unparse(tree)
    return None if out == ast.unparse(ast.parse(src)) else out


# -- running ------------------------------------------------------------------------------
def copy_tree(dest: Path, base: Path = ROOT) -> None:
    """The package, the tests and what they read, copied from ``base`` to ``dest`` (no caches)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in ("gspmd_py", "tests"):
        shutil.copytree(base / name, dest / name, ignore=ignore)
    for name in ("setup.cfg", "pyproject.toml", "conftest.py", "pytest.ini"):
        if (base / name).exists():
            shutil.copy(base / name, dest / name)


def worker(tier: list[str], timeout: float, base: Path) -> None:
    """Read mutants (JSON lines) on stdin, print one JSON result line per mutant."""
    import faulthandler
    import signal

    import pytest

    faulthandler.enable()
    for line in sys.stdin:
        m = Mutant(**json.loads(line))
        src = mutated_source(m, base)
        if src is None:
            print(json.dumps({"name": m.name, "status": "not-applied"}), flush=True)
            continue
        with tempfile.TemporaryDirectory(prefix="gspmd-mutant-") as tmp:
            dest = Path(tmp)
            copy_tree(dest, base)
            (dest / m.path).write_text(src)
            for mod in [k for k in sys.modules if k == "gspmd_py" or k.startswith(("gspmd_py.", "test_", "conftest",
                                                                                  "partition_util", "layout_chains"))]:
                del sys.modules[mod]
            sys.path[:0] = [str(dest), str(dest / "tests")]
            old = os.getcwd()
            os.chdir(dest)
            t0 = time.time()

            def alarm(*_):
                raise TimeoutError("mutant ran past the timeout")

            signal.signal(signal.SIGALRM, alarm)
            signal.alarm(int(timeout))
            try:
                # in this process (-n 0 over setup.cfg's xdist): the copy on sys.path is what runs
                rc = pytest.main(["-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly",
                                  *(tier or tier_for(m.path))])
                status = "survived" if rc == 0 else ("killed" if rc in (1, 2, 3) else f"error-{int(rc)}")
            except TimeoutError:
                status = "killed-timeout"
            except BaseException as e:  # noqa: BLE001 - a mutant that crashes the import is killed
                status = f"killed-crash:{type(e).__name__}"
            finally:
                signal.alarm(0)
                os.chdir(old)
                del sys.path[:2]
            loaded = getattr(sys.modules.get("gspmd_py"), "__file__", "") or ""
            if not loaded.startswith(str(dest)):
                status = f"error-imported:{loaded}"  # the tier ran another copy of the package
            print(json.dumps({"name": m.name, "status": status, "seconds": round(time.time() - t0, 1)}), flush=True)


def run(mutants: list[Mutant], tier: list[str], timeout: float, log: Optional[Path]) -> list[dict]:
    """Run ``mutants`` against ``tier`` in one worker, from a snapshot of the sources taken now
    (edits made to the worktree while it runs do not leak into the mutants)."""
    snap = Path(tempfile.mkdtemp(prefix="gspmd-mutate-base-"))
    copy_tree(snap)
    try:
        return _run(mutants, tier, timeout, log, snap)
    finally:
        shutil.rmtree(snap, ignore_errors=True)


def _run(mutants: list[Mutant], tier: list[str], timeout: float, log: Optional[Path], base: Path) -> list[dict]:
    env = dict(os.environ, GSPMD_PY_VERIFY="plan", PYTHONHASHSEED="0")
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, __file__, "--worker", "--timeout", str(timeout), "--tier", json.dumps(tier),
           "--base", str(base)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env, cwd=ROOT)
    results = []
    for m in mutants:
        proc.stdin.write(json.dumps({**m.__dict__, "end": list(m.end)}) + "\n")
    proc.stdin.close()
    for line in proc.stdout:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        results.append(r)
        print(f"{len(results):4d}/{len(mutants)} {r['status']:<16} {r.get('seconds', 0):6}s {r['name']}", flush=True)
        if log is not None:
            with log.open("a") as f:
                f.write(line + "\n")
    proc.wait()
    return results


def report(results: list[dict], command: str, notes: str = "") -> str:
    """The markdown report: the score, per kind, every survivor (``notes``: the explanations)."""
    from collections import Counter

    applied = [r for r in results if r["status"] != "not-applied"]
    killed = [r for r in applied if r["status"].startswith("killed")]
    kind = lambda r: r["name"].split(":")[3].split("#")[0]  # noqa: E731
    per_kind_all, per_kind_killed = Counter(kind(r) for r in applied), Counter(kind(r) for r in killed)
    lines = ["# Mutation testing: the fast tier against mutants of the partitioner, program layer and index math",
             "", f"Command: `{command}`", "",
             f"**Score: {len(killed)} of {len(applied)} mutants killed ({100 * len(killed) / max(len(applied), 1):.1f}%)**"
             f", {sum(r.get('seconds', 0) for r in applied) / 60:.0f} min of wall time in one warm worker.", "",
             "| kind | mutants | killed |", "|---|---|---|"]
    lines += [f"| {k} | {per_kind_all[k]} | {per_kind_killed[k]} |" for k in sorted(per_kind_all)]
    lines += ["", "## Survivors", ""]
    lines += [f"- `{r['name']}`" for r in applied if not r["status"].startswith("killed")] or ["(none)"]
    return "\n".join(lines) + ("\n\n" + notes.strip() + "\n" if notes else "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--tier", default="[]", help="pytest arguments (JSON list) for every mutant; "
                    "default: tier_for(the mutated module)")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--log", default="")
    ap.add_argument("--report", default="", help="write the markdown report here")
    ap.add_argument("--notes", default="", help="a markdown file appended to the report (the survivors explained)")
    ap.add_argument("--command", default="", help="with --from-log: the command the log came from")
    ap.add_argument("--from-log", default="", help="no run: the report from a --log file of an earlier run")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--base", default=str(ROOT))
    args = ap.parse_args(argv)
    tier = json.loads(args.tier)
    if args.worker:
        worker(tier, args.timeout, Path(args.base))
        return 0
    if args.from_log:
        results = [json.loads(x) for x in Path(args.from_log).read_text().splitlines() if x.strip()]
        notes = Path(args.notes).read_text() if args.notes else ""
        text = report(results, args.command or "python tools/mutate.py (see --log)", notes)
        Path(args.report).write_text(text) if args.report else print(text)
        return 0
    pts = all_points()
    if args.list:
        from collections import Counter

        for k, n in sorted(Counter(m.kind for m in pts).items()):
            print(f"{k:16} {n}")
        print(f"{'total':16} {len(pts)}")
        return 0
    if args.only:
        chosen = [m for m in pts if m.name in args.only]
    elif args.all:
        chosen = pts
    else:
        chosen = stratified(pts, args.sample or 100, args.seed)
    results = run(chosen, tier, args.timeout, Path(args.log) if args.log else None)
    if args.report:
        notes = Path(args.notes).read_text() if args.notes else ""
        Path(args.report).write_text(report(results, "python tools/mutate.py " + " ".join(argv or sys.argv[1:]),
                                            notes))
    killed = sum(r["status"].startswith("killed") for r in results)
    applied = sum(r["status"] != "not-applied" for r in results)
    print(f"killed {killed} of {applied} applied mutants ({100 * killed / max(applied, 1):.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
