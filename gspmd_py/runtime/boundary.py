"""The program boundary: user arrays in, global jax.Arrays in the plan's shardings.

The compiled program takes each input as a global jax.Array in its input sharding,
padded to whole shards on dims that do not divide. Per call, :meth:`Boundary.call` does
no more than ``jax.jit`` does:

* even inputs go to the compiled executable as they are: numpy arrays are transferred
  by it straight from host into their shards (one transfer, no stop on one device), and
  jax.Arrays already in the input sharding pass through untouched;
* uneven numpy inputs are padded on the host, never by a compiled pad (the first call
  pays no more for padding than later calls): from :data:`HOST_PAD_MIN_BYTES` up per shard
  with ``jax.make_array_from_callback`` (each device receives its block, the last ones
  padded; no padded copy of the whole array is made), smaller ones whole with ``np.pad``,
  then transferred by the executable like an even numpy input;
* uneven jax.Arrays (e.g. a previous call's outputs, which keep their logical shape) go to
  a second executable, compiled on first use, that pads them inside the program: one
  dispatch per call, as ``jax.jit`` needs;
* only when the executable rejects an argument (a jax.Array laid out differently) are
  the inputs placed explicitly (:meth:`Boundary.place`: ``jax.device_put`` into the
  input sharding) and the call retried.

On a multi-process run (``jax.distributed``) every input is placed by
``global_inputs.place_global`` (each process transfers only the shards its devices hold).

    c = plan.lower().compile()               # runtime/stages.py's Compiled: its boundary is Boundary.of(plan, traced jaxpr)
    outs = c.boundary.call(c.compiled, leaves)   # flat list of output jax.Arrays
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding

from ..core.errors import ArgumentError, DeletedArrayError
from .layout import input_sharding
from .placed import MARK, logical_shape, mark, unpad


#: Uneven numpy inputs from this size up are padded per shard on the host (each device gets
#: its block: for a 2 MiB input, 7.6 ms against 11 ms for moving it whole, as jax.jit does);
#: smaller ones are padded whole with ``np.pad`` and transferred by the executable (the 8
#: per-shard callbacks cost ~0.5 ms, more than the bytes they save).
HOST_PAD_MIN_BYTES = 256 * 1024


class Boundary:
    """How one plan's flat input leaves become its compiled program's arguments."""

    __slots__ = ("targets", "shapes", "padded_shapes", "dtypes", "uneven", "_pad_fns", "_global", "_jaxpr",
                 "_fused", "donate", "names", "fn_name")

    def __init__(self, targets: Sequence[NamedSharding], shapes: Sequence[tuple[int, ...]],
                 padded_shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype],
                 place_global: Optional[Callable[[Sequence[Any]], list]] = None, jaxpr=None,
                 donate: tuple[int, ...] = (), names: Sequence[str] = (), fn_name: str = "the function"):
        self.names, self.fn_name = tuple(names), fn_name  # leaves by key path, for messages
        self._global = place_global  # multi-process runs: places every leaf
        self._jaxpr = jaxpr  # the program on padded inputs (a ClosedJaxpr), for the fused pad + program
        self._fused: Optional[Callable] = None
        self.donate = tuple(donate)  # donated inputs (the fused program donates them too)
        self.targets = tuple(targets)
        self.shapes = tuple(tuple(s) for s in shapes)
        self.padded_shapes = tuple(tuple(s) for s in padded_shapes)
        self.dtypes = tuple(d if jax.dtypes.issubdtype(d, jax.dtypes.extended) else np.dtype(d) for d in dtypes)  # keys stay keys
        self.uneven = tuple(i for i, (s, p) in enumerate(zip(self.shapes, self.padded_shapes)) if s != p)
        self._pad_fns: dict[int, Callable] = {}

    @classmethod
    def of(cls, plan, jaxpr=None) -> "Boundary":
        """The boundary of ``plan``; ``jaxpr``: its program on padded inputs (a ClosedJaxpr: the
        traced jit, stages.py), for the fused pad + program (None: never fused)."""
        glob = None
        if jax.process_count() > 1:  # multi-process: place only this process's shards
            import weakref

            from .global_inputs import place_global

            ref = weakref.ref(plan)  # no plan <-> boundary cycle
            glob = lambda leaves: place_global(ref(), list(leaves))  # noqa: E731
        return cls([input_sharding(plan, i) for i in range(len(plan.in_specs))],
                   [v.shape for v in plan.graph.inputs], plan.padded_in_shapes,
                   [v.dtype for v in plan.graph.inputs], glob, jaxpr,
                   tuple(plan.donate_argnums), list(plan.in_names), plan.fn_name)

    # -- per call --------------------------------------------------------------------
    def call(self, executable: Callable, leaves: Sequence[Any]):
        """``executable`` (the compiled program) on the leaves; placed explicitly only if it rejects them."""
        seen: dict[int, int] = {}
        for i, x in enumerate(leaves):  # XLA crashes the process (SIGSEGV) on a deleted buffer
            if isinstance(x, jax.Array):
                if x.is_deleted():
                    raise self._deleted(i, x)
                if self.donate:  # and on one buffer passed twice where one of them is donated (jax 0.10)
                    j = seen.setdefault(id(x), i)
                    if j != i and (i in self.donate or j in self.donate):
                        raise self._donated_twice(j, i, x)
                if getattr(x, MARK, None) is not None and x.shape != self.padded_shapes[i]:
                    leaves = self._unpadded(leaves)  # placed (padded) for a plan that pads it otherwise
                    break
        if self._global is not None:
            return executable(*self._global(leaves))
        args, exe = leaves, executable
        if self.uneven:
            args = list(leaves)
            for i in self.uneven:
                x = args[i]
                if np.shape(x) == self.padded_shapes[i]:  # padded already (e.g. from_local's blocks)
                    continue
                if isinstance(x, jax.Array):
                    if self._jaxpr is not None:
                        exe = self._fused_program(executable)  # pads inside: one dispatch
                    else:
                        args[i] = self.pad(i, x)
                elif np.size(x) * self.dtypes[i].itemsize < HOST_PAD_MIN_BYTES:
                    args[i] = _host_pad_whole(x, self.padded_shapes[i], self.dtypes[i])  # no compile
                else:
                    args[i] = self.pad(i, x)
        try:
            return exe(*args)
        except ValueError:  # e.g. a jax.Array in another sharding: place, then call again
            placed = self.place(args)
        return executable(*placed)

    def _deleted(self, i: int, x) -> DeletedArrayError:
        name = self.names[i] if i < len(self.names) else f"leaf {i}"
        why = ("donate_argnums gave its buffers to an earlier call" if i in self.donate
               else "its buffers were donated to another function, or deleted")
        return DeletedArrayError(
            f"{self.fn_name}: argument {name} {np.dtype(x.dtype).name}{list(x.shape)} has been deleted (as jax.jit "
            f"says: Array has been deleted): {why}; pass a live array, e.g. that call's output")

    def _donated_twice(self, j: int, i: int, x) -> ArgumentError:
        name = lambda k: self.names[k] if k < len(self.names) else f"leaf {k}"  # noqa: E731
        return ArgumentError(
            f"{self.fn_name}: arguments {name(j)} and {name(i)} are one array ({np.dtype(x.dtype).name}"
            f"{list(x.shape)}) and donate_argnums donates {name(j) if j in self.donate else name(i)}: a donated "
            f"buffer cannot be read again in the same call (XLA: 'Attempt to use a buffer that was previously "
            f"donated in the same call'); pass a copy (x.copy()) or donate neither")

    def _fused_program(self, executable):
        """A jit of (pad the uneven inputs that arrive unpadded) then the program, for jax.Array
        inputs of the logical shape in any sharding (compiled per input layout, on first use)."""
        if self._fused is None:
            closed, padded, dtypes = self._jaxpr, self.padded_shapes, self.dtypes

            def run(*xs):
                xs = [pad_array(x, [(0, p - n) for n, p in zip(x.shape, padded[i])], dtypes[i])
                      if x.shape != padded[i] else x for i, x in enumerate(xs)]
                return tuple(jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *xs))  # no re-trace of the plan

            in_sh = tuple(None if i in self.uneven else t for i, t in enumerate(self.targets))
            self._fused = jax.jit(run, in_shardings=in_sh, out_shardings=tuple(executable.output_shardings),
                                  donate_argnums=self.donate)
        return self._fused

    # -- placement -------------------------------------------------------------------
    def place(self, leaves: Sequence[Any]) -> list:
        """Every leaf as a global jax.Array in its input sharding (uneven dims padded).

        jax.Arrays already laid out so are returned as they are (the same object). An array
        padded here is marked with its logical shape (placed.py): passed back to a gp.spmd
        function it is planned and computed on as the array it stands for, never its padding.
        """
        leaves = self._unpadded(leaves)
        out = self._global(leaves) if self._global is not None else [
            self._put(i, self.pad(i, x) if i in self.uneven and tuple(np.shape(x)) == self.shapes[i] else x)
            for i, x in enumerate(leaves)]
        for i in self.uneven:  # padded from an array of the logical shape: it says so (placed.py)
            came = logical_shape(leaves[i]) or tuple(np.shape(leaves[i]))
            if came == self.shapes[i] and out[i].shape == self.padded_shapes[i]:
                mark(out[i], self.shapes[i])
        return out

    def _unpadded(self, leaves: Sequence[Any]) -> list:
        """The leaves, each array ``place`` padded (placed.py) that this plan does not take as it
        is cut back to its logical shape."""
        out = list(leaves)
        for i, x in enumerate(out):
            m = logical_shape(x)
            if m is not None and x.shape != self.padded_shapes[i]:
                out[i] = unpad(x, m)
        return out

    def _put(self, i: int, x):
        target, dtype = self.targets[i], self.dtypes[i]
        if isinstance(x, jax.Array):
            if x.sharding == target or x.sharding.is_equivalent_to(target, x.ndim):
                return x
            return jax.device_put(x if x.dtype == dtype else x.astype(dtype), target)
        return jax.device_put(np.asarray(x, dtype=dtype), target)

    def pad(self, i: int, x):
        """Leaf ``i`` (an uneven input of its logical shape) padded to whole shards, in its input sharding."""
        if isinstance(x, jax.Array):
            if x.sharding.device_set != self.targets[i].device_set:  # e.g. on one device: move it first
                x = jax.device_put(x, _even(self.targets[i], self.shapes[i]))
            fn = self._pad_fns.get(i)
            if fn is None:
                fn = self._pad_fns[i] = _device_pad(self.shapes[i], self.padded_shapes[i], self.dtypes[i],
                                                    self.targets[i])
            return fn(x)
        return host_pad(np.asarray(x), self.padded_shapes[i], self.dtypes[i], self.targets[i])


def _even(target: NamedSharding, shape: Sequence[int]) -> NamedSharding:
    """``target`` without the axes of dims they do not divide (the nearest sharding ``shape`` can hold)."""
    from jax.sharding import PartitionSpec

    sizes = dict(zip(target.mesh.axis_names, target.mesh.axis_sizes))
    out = []
    for n, e in zip(shape, tuple(target.spec) + (None,) * (len(shape) - len(target.spec))):
        names = () if e is None else ((e,) if isinstance(e, str) else tuple(e))
        out.append(e if n % int(np.prod([sizes[a] for a in names], dtype=np.int64)) == 0 else None)
    return NamedSharding(target.mesh, PartitionSpec(*out))


def host_pad(x: np.ndarray, padded_shape: tuple[int, ...], dtype: np.dtype, target: NamedSharding):
    """A numpy array padded with zeros to ``padded_shape``, built shard by shard on the devices.

    >>> mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("x",))
    >>> a = host_pad(np.arange(3.0), (4,), np.dtype("float32"), NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    >>> a.tolist(), [s.data.tolist() for s in a.addressable_shards]
    ([0.0, 1.0, 2.0, 0.0], [[0.0, 1.0], [2.0, 0.0]])
    """
    shape = x.shape

    def block(index: tuple[slice, ...]) -> np.ndarray:
        src, pads = [], []
        for sl, n, p in zip(index, shape, padded_shape):
            start, stop, _ = sl.indices(p)
            a, b = min(start, n), min(stop, n)
            src.append(slice(a, b))
            pads.append((0, (stop - start) - (b - a)))
        blk = np.asarray(x[tuple(src)], dtype=dtype)
        return np.pad(blk, pads) if any(hi for _, hi in pads) else blk

    return jax.make_array_from_callback(padded_shape, target, block)


def _host_pad_whole(x, padded_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A numpy value zero-padded to ``padded_shape`` on the host (one small copy: the executable
    then transfers it as it does an even numpy input; nothing is compiled for the padding).

    >>> _host_pad_whole(np.arange(3), (4,), np.dtype("float32")).tolist()
    [0.0, 1.0, 2.0, 0.0]
    """
    a = np.asarray(x, dtype=dtype)
    return np.pad(a, [(0, p - n) for n, p in zip(a.shape, padded_shape)])


def _device_pad(shape: tuple[int, ...], padded_shape: tuple[int, ...], dtype: np.dtype,
                target: NamedSharding) -> Callable:
    """A jitted function padding a jax.Array of ``shape`` to ``padded_shape`` into ``target``."""
    pads = [(0, p - n) for n, p in zip(shape, padded_shape)]
    return jax.jit(lambda v: pad_array(v, pads, dtype), out_shardings=target)


def pad_array(x, pads: Sequence[tuple[int, int]], dtype):
    """``x`` as ``dtype``, zero-padded by ``pads`` (low, high) per dim; a typed PRNG key array
    is padded as its uint32 words (jnp.pad takes no key dtype)."""
    import jax.numpy as jnp

    from ..partitioner.context import on_words

    if x.dtype != dtype:
        x = x.astype(dtype)
    return on_words(lambda w: jnp.pad(w, list(pads) + [(0, 0)] * (w.ndim - len(pads))), x)


# ---------------------------------------------------------------------------------------
# the per-call cache lookup
# ---------------------------------------------------------------------------------------

#: Plans a gp.spmd function keeps (least recently used evicted first). A plan holds its
#: graph, shardings and compiled executable: a few MiB for a transformer block.
PLAN_CACHE_SIZE = 64


def collect_evicted() -> None:
    """A full collection after evictions from a plan cache.

    A plan holds reference cycles (an IR value and the op that makes it, the plan and its
    stages: runtime/stages.py), so an evicted plan is freed only by the cyclic collector, whose full passes
    are rare (and paused while plans are built: compiler.gc_paused). A function called with
    more shapes than its cache holds kept about twice its cache's plans alive, and the heap
    grew to hold them (80 shapes through a 64-plan cache: +110 MB). One pass per half cache of
    evictions (each eviction is a re-plan, dearer than the pass) frees them while their memory
    can still be reused. A collector the user turned off stays off."""
    import gc

    if gc.isenabled():
        gc.collect()


def call_key(args) -> tuple[Any, list, Any]:
    """``(key, leaves, treedef)`` of a call's arguments: the key is the tree and each leaf's
    (type, shape, dtype, weak type), or its type for Python scalars. Cheap: no avals are built.

    >>> key, leaves, tree = call_key((np.zeros((2, 3), np.float32), 1.5))
    >>> key[1]
    ((<class 'numpy.ndarray'>, (2, 3), dtype('float32'), False), (<class 'float'>,))
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    try:
        # (an array plan.place padded keys as its logical shape: placed.py)
        sig = tuple([(type(x), x.shape, x.dtype, False) if type(x) is np.ndarray else
                     (type(x), getattr(x, MARK, None) or x.shape, x.dtype, getattr(x, "weak_type", False))
                     for x in leaves])
    except AttributeError:
        sig = tuple([(type(x), getattr(x, MARK, None) or x.shape, x.dtype, getattr(x, "weak_type", False))
                     if hasattr(x, "shape") and hasattr(x, "dtype") else (type(x),) for x in leaves])
    return (tree, sig), leaves, tree


class PlanCache:
    """A bounded LRU of plans by call key (several keys, e.g. float64 and float32 inputs
    that canonicalise alike, may share one plan).

    >>> c = PlanCache(2)
    >>> c.put("a", 1); c.put("b", 2); c.get("a"); c.put("c", 3)
    1
    >>> sorted(c.keys())                      # "b" was the least recently used
    ['a', 'c']
    """

    __slots__ = ("maxsize", "_d", "collect", "_evicted")

    def __init__(self, maxsize: int = PLAN_CACHE_SIZE, collect: bool = False):
        from collections import OrderedDict

        self.maxsize = maxsize
        self._d: "OrderedDict[Any, Any]" = OrderedDict()
        self.collect = collect  # collect the evicted plans (see ``collect_evicted``)
        self._evicted = 0  # evictions since the last collection

    def get(self, key):
        p = self._d.get(key)
        if p is not None:
            try:
                self._d.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return p

    def put(self, key, plan) -> None:
        self._d[key] = plan
        self._d.move_to_end(key)
        while len(self._d) > self.maxsize:
            self._d.popitem(last=False)
            self._evicted += 1
        if self.collect and self._evicted >= max(1, self.maxsize // 2):
            self._evicted = 0
            collect_evicted()

    def keys(self):
        return list(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d
