"""Host callbacks (``jax.pure_callback``, ``jax.debug.print`` / ``jax.debug.callback``): called
once per call, by the first device, with the whole operands (as jax.jit calls them), and a
failure is a Python exception, never a hang.

Per device, the SPMD program does::

    outs, failed = cond(first device, guarded(whole operands), (identities, 0))
    outs, failed = psum((outs, failed), all axes)   # the first device's results, everywhere
    ok = pure_callback(check, failed)                # every device: raises when the call failed
    outs = where(ok == 0, outs, 0)                   # (ties the check to the results)

A debug callback has no results: only its ``failed`` flag is broadcast, and the check is an
effect (``jax.debug.callback``) so that it stays in the program.

``guarded`` runs the user's callback and catches what it raises (keeping it), so the first
device still reaches the broadcast and no device waits in a collective for one that
stopped (XLA aborts the process after 40 s then). Every device then fails at the same
point, in ``check``, after the last collective of the op. ``Compiled.run`` (runtime/stages.py) turns that into the
callback's own exception (``raise_failures``); staged into another jit (``jax.jit(f)``)
the call fails with JAX's runtime error, whose message names the callback and its error.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..core import jax_compat as compat
from jax import lax

from ..core.dtypes import additive_identity
from .context import Ctx
from .fallback import say_if_sharded
from .registry import handler


class HostCallFailed(RuntimeError):
    """Raised on every device by the check after a failed host callback (never seen by the user
    of a direct call: ``raise_failures`` re-raises the callback's own exception)."""


class HostCall:
    """One jax.pure_callback of a plan: the flat callback guarded, and the failure it caught."""

    def __init__(self, callback, result_avals: Sequence[Any], where: str):
        self.callback, self.result_avals, self.where = callback, tuple(result_avals), where
        self.error: Optional[BaseException] = None

    def __call__(self, *args):
        """On the first device: the callback's results and 0, or placeholders and 1 when it raised."""
        try:
            outs = list(self.callback(*args))
        except BaseException as e:  # noqa: BLE001 - kept, and re-raised by Compiled.run after the call
            if self.error is None:
                self.error = e
            return [np.zeros(a.shape, a.dtype) for a in self.result_avals] + [np.int32(1)]
        return outs + [np.int32(0)]

    def check(self, failed) -> np.ndarray:
        """On every device, after the broadcast: raise when the call failed."""
        if int(failed):
            err = self.error
            said = f"{type(err).__name__}: {err}" if err is not None else "an exception (on another process)"
            raise HostCallFailed(f"{self.where} raised {said}")
        return np.zeros((), np.int32)

    def take_error(self) -> Optional[BaseException]:
        err, self.error = self.error, None
        return err


@handler("pure_callback")
def pure_callback(ctx: Ctx, op, rule, plan, args):
    say_if_sharded(ctx, op, "called once, by the first device, with whole values")
    avals = tuple(op.params["result_avals"])
    call = HostCall(op.params["callback"], avals, f"jax.pure_callback at {op.source or 'op %d' % op.id}")
    ctx.host_call(call)
    params = dict(op.params, callback=call, result_avals=avals + (jax.core.ShapedArray((), jnp.int32),))
    axes = ctx.fine.names
    first = ctx.index(axes) == 0 if axes else jnp.bool_(True)

    def run(xs):
        return list(op.primitive.bind(*xs, **params))

    def skip(xs):
        return [jnp.full(a.shape, additive_identity(a.dtype), a.dtype) for a in avals] + [jnp.int32(0)]

    outs = lax.cond(first, run, skip, [a.x for a in args])
    if axes:
        outs = [_broadcast(ctx, o, axes) for o in outs]
    *outs, failed = outs
    ok = jax.pure_callback(call.check, jax.ShapeDtypeStruct((), jnp.int32), failed)
    outs = [jnp.where(ok == 0, o, jnp.zeros_like(o)) for o in outs]
    return [ctx.pv(o, v.shape, ((),) * v.rank) for o, v in zip(outs, op.outputs)]


@handler("host_callback")
def host_callback(ctx: Ctx, op, rule, plan, args):
    """jax.debug.print / debug.callback: the first device calls it with the whole operands (they
    arrive replicated); its failure flag is broadcast and checked on every device."""
    what = "jax.debug.print" if op.prim == "debug_print" else "jax.debug.callback"
    call = HostCall(_flat(op), (), f"{what} at {op.source or 'op %d' % op.id}")
    ctx.host_call(call)
    axes = ctx.fine.names
    first = ctx.index(axes) == 0 if axes else jnp.bool_(True)
    flag = jax.ShapeDtypeStruct((), jnp.int32)

    def run(xs):
        return jax.pure_callback(call, [flag], *xs)[0]

    failed = lax.cond(first, run, lambda xs: jnp.int32(0), [a.x for a in args])
    if axes:
        failed = _broadcast(ctx, failed, axes)
    jax.debug.callback(call.check, failed)
    return []


def _flat(op):
    """The op's own call on flat operands: debug_callback's flat callback, or debug_print's
    formatting and printing (``jax.debug.print`` binds its format and arguments)."""
    if "callback" in op.params:
        return lambda *xs: list(op.params["callback"](*xs) or ())

    def printed(*xs):
        op.primitive.impl(*xs, **op.params)
        return []

    return printed


def _broadcast(ctx: Ctx, x, axes: Sequence[str]):
    """The first device's ``x`` on every device: a sum where the others hold the additive identity."""
    if x.dtype == jnp.bool_:
        return ctx.all_reduce(x.astype(jnp.uint8), axes) != 0
    return ctx.all_reduce(x, axes)


@contextlib.contextmanager
def raise_failures(calls: Sequence[HostCall], fn_name: str) -> Iterator[None]:
    """Around a direct call of a plan with host callbacks (its results waited for): a callback's
    exception is re-raised as itself, with a note naming where it was called."""
    for c in calls:  # left by a run staged into another jit (which raised JAX's runtime error)
        c.take_error()
    try:
        yield
    except Exception:
        failed = _failure(calls)
        if failed is None:
            raise
        call, err = failed
        _drop_failed_tokens()
        err.add_note(f"(raised by the host callback of {call.where}, called once by {fn_name} under gp.spmd)")
        raise err from None


def _drop_failed_tokens() -> None:
    """JAX keeps each device's runtime token of the last computation with host callbacks and waits
    on it at exit, where the failure would be raised again ("Exception ignored in atexit
    callback"): the failed call was waited for and reported, so its tokens go. (Private API:
    without it only the exit is noisier.)"""
    tokens = compat.runtime_tokens()
    for device, token in list(tokens.items()):
        try:
            token.block_until_ready()
        except Exception:  # noqa: BLE001 - the failed call's own token
            tokens.pop(device, None)


def _failure(calls: Sequence[HostCall]) -> Optional[tuple[HostCall, BaseException]]:
    """The first failed call and its exception; every call's kept exception is cleared."""
    found = [(c, e) for c in calls for e in (c.take_error(),) if e is not None]
    return found[0] if found else None


class _QuietChecks(logging.Filter):
    """JAX logs every failing callback with its traceback; the check fails on every device by
    design (8 tracebacks of HostCallFailed), after the one real error was kept: drop those."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, HostCallFailed)


logging.getLogger("jax._src.callback").addFilter(_QuietChecks())
logging.getLogger("jax._src.debugging").addFilter(_QuietChecks())
