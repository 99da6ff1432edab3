"""The event loop an app runs its ``async def`` listeners on, reached from any thread.

RocketMQ clients hand check-backs and deliveries to their own threads (librocketmq's native
threads, the 5.x client's pool), and txmsg's executors run them on threads of their own.  An
``async def`` listener cannot run there: its coroutine needs an event loop, and the loop that
matters is the service's own (where its async database engine and HTTP clients live).  So the
thread that received the work submits the coroutine to that loop with
:func:`asyncio.run_coroutine_threadsafe` and waits for its result (:meth:`LoopBridge.run`).  The
thread stays the unit of concurrency: a group's ``concurrency`` threads (a consumer's client
threads) are at most that many coroutines at once, and the rejection policy and check-back rules
apply to them as they did to plain listeners.

An app started with ``async with app:`` (:meth:`txmsg.TxMsg.astart`) binds the running loop; an
app with async listeners started the plain way (``with app:``) gets a loop on a thread of its own
(:meth:`LoopBridge.on_own_thread`).  Closing waits for the coroutines still running (the drain),
then stops an owned loop.

Each listener coroutine is timed step by step (:func:`watched`): a step that keeps the loop busy
longer than ``slow_step`` seconds (a blocking call inside ``async def``) stalls every other
request of the service, so it is logged as a WARNING naming the listener, once per listener.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, Final, TypeVar, cast

from txmsg.errors import LifecycleError

log = logging.getLogger("txmsg.aio")

T = TypeVar("T")

SLOW_STEP: Final = 0.1
"""Seconds one step of a listener coroutine may hold the loop before txmsg warns (asyncio's own
debug threshold, ``loop.slow_callback_duration``, is the same 100 ms)."""


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class LoopBlockingWarning(RuntimeWarning):
    """A blocking send (``producer.send_in_transaction``, ``send`` ...) was called on a running
    event loop: every other coroutine of the service waits for the broker round trip.  The fix
    is the awaitable producer, ``await app.async_producer(group).send(...)``, or
    ``await app.async_transactional_producer(group).send_in_transaction(...)``."""


def _awaitable(method: str) -> str:
    """The app method whose producer awaits ``method``."""
    if method.startswith("send_in_transaction"):
        return "async_transactional_producer"
    return "async_producer"


def warn_blocking_send(group: str, method: str) -> None:
    """Warn (:class:`~txmsg.errors.LoopBlockingWarning`) when the blocking ``method`` of
    producer ``group`` is called on a running event loop, pointing at the caller's line."""
    if running_loop() is None:
        return
    warnings.warn(
        f"producer group {group!r}: {method}() blocks this event loop for the broker round "
        f"trip (every other request waits); use `await app.{_awaitable(method)}({group!r})."
        f"{method}(...)` in coroutines",
        LoopBlockingWarning,
        stacklevel=3,
    )


def warn_start_on_running_loop() -> None:
    """Warn (:class:`~txmsg.errors.LoopBlockingWarning`) when an app with ``async def`` listeners
    is started the plain way (``with app:``, ``app.start()``) in a thread running an event loop:
    the start blocks that loop, and the listeners then run on the app's own loop thread, not on
    the service's, where a connection pool bound to the service's loop (asyncpg) fails."""
    if running_loop() is None:
        return
    warnings.warn(
        "app.start() (`with app:`) on a running event loop: it blocks this loop while the "
        "clients start, and the async def listeners run on txmsg's own loop thread "
        "(txmsg-loop), not on this loop, so engines and clients bound to this loop fail in "
        "them; use `async with app:` (or `await app.astart()`) in coroutines",
        LoopBlockingWarning,
        stacklevel=4,
    )


class LoopBridge:
    """Runs listener coroutines on one event loop for callers on other threads.

    Parameters:
        loop: the loop (running, or about to run on ``thread``).
        thread: the loop's own thread when the bridge owns it (:meth:`on_own_thread`); closing
            the bridge then stops the loop and joins the thread.
        slow_step: see :data:`SLOW_STEP`.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        thread: threading.Thread | None = None,
        slow_step: float = SLOW_STEP,
    ) -> None:
        self.loop = loop
        self.slow_step = slow_step
        self._thread = thread
        self._lock = threading.Lock()
        self._pending: set[Future[Any]] = set()
        self._closed = False
        self._warned: set[str] = set()
        self.slow_steps: dict[str, int] = {}
        """Listener name -> steps that held the loop longer than ``slow_step``."""

    # ---- making one ---------------------------------------------------------------------------
    @classmethod
    def of_running_loop(cls, *, slow_step: float = SLOW_STEP) -> LoopBridge:
        """A bridge to the loop running in this thread (``async with app:``).

        Raises:
            LifecycleError: no loop runs in this thread.
        """
        loop = running_loop()
        if loop is None:
            raise LifecycleError(
                "no event loop is running in this thread; call `await app.astart()` (or "
                "`async with app:`) from a coroutine, or use `with app:` in plain code"
            )
        return cls(loop, slow_step=slow_step)

    @classmethod
    def on_own_thread(cls, name: str = "txmsg-loop", *, slow_step: float = SLOW_STEP) -> LoopBridge:
        """A new loop running on a daemon thread of its own (``with app:`` and async listeners)."""
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(started.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        started.wait()
        return cls(loop, thread=thread, slow_step=slow_step)

    @property
    def owns_loop(self) -> bool:
        """True when the loop runs on the bridge's own thread."""
        return self._thread is not None

    def in_loop_thread(self) -> bool:
        """True when called from the loop's own thread (where waiting for it would deadlock)."""
        return running_loop() is self.loop

    # ---- running coroutines ---------------------------------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, T], *, name: str) -> Future[T]:
        """Schedule ``coro`` on the loop (from any thread); its future is tracked for the drain.

        Raises:
            LifecycleError: the bridge is closed or its loop is not running (the coroutine is
                closed, never started).
        """
        with self._lock:
            if self._closed or self.loop.is_closed() or not self.loop.is_running():
                coro.close()
                why = "closed" if self._closed else "not running"
                raise LifecycleError(
                    f"the event loop of this app is {why}, so {name} cannot run; keep the loop "
                    "running until `await app.aclose()` returns"
                )
            future = asyncio.run_coroutine_threadsafe(self.watched(coro, name), self.loop)
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, name: str) -> T:
        """Call ``fn(*args)`` (an ``async def``) on the loop and wait here for its result.

        Raises:
            LifecycleError: called on the loop's own thread (it would wait for itself forever),
                or the loop is gone.
            Exception: whatever the coroutine raised, unchanged.
        """
        if self.in_loop_thread():
            raise LifecycleError(
                f"{name} is `async def` and was called from its own event loop's thread through "
                "a blocking call, which would wait for itself forever; from a coroutine use the "
                "awaitable API (`await app.async_transactional_producer(group)"
                ".send_in_transaction(...)`)"
            )
        return self.submit(fn(*args), name=name).result()

    def _forget(self, future: Future[Any]) -> None:
        # Runs on the loop's thread as each coroutine ends.  No lock: a thread in submit() holds
        # it across call_soon_threadsafe's pipe write (it drops the GIL there), and the loop
        # waiting for that thread to get the GIL back stalled every coroutine of the service
        # (docs/guide/async.md#measured).  set.discard is one atomic
        # step under the GIL, as are the copies submit() and close() take under the lock.
        self._pending.discard(future)

    async def watched(self, coro: Coroutine[Any, Any, T], name: str) -> T:
        """``await coro``, timing each of its steps (module docstring)."""
        return cast(T, await _Timed(coro, name, self))

    def _slow(self, name: str, seconds: float) -> None:
        with self._lock:
            self.slow_steps[name] = self.slow_steps.get(name, 0) + 1
            first = name not in self._warned
            self._warned.add(name)
        if first:
            log.warning(
                "%s held the event loop for %.0f ms without awaiting (everything else on the loop "
                "waited): a blocking call inside `async def`. Await an async API instead (async "
                "SQLAlchemy, asyncio.sleep), or run the blocking part with `await "
                "asyncio.to_thread(...)`. Logged once per listener; bridge.slow_steps counts them",
                name,
                seconds * 1000,
            )

    # ---- closing ------------------------------------------------------------------------------
    @property
    def refusing(self) -> bool:
        """True once the bridge refuses coroutines (closed, or its loop stopped): a listener
        failing now was interrupted by the shutdown, not by its message."""
        return self._closed or self.loop.is_closed() or not self.loop.is_running()

    @property
    def pending(self) -> int:
        """Listener coroutines submitted and not finished."""
        with self._lock:
            return len(self._pending)

    def cancel_pending(self) -> int:
        """Cancel the listener coroutines still running (each sees :class:`asyncio.CancelledError`;
        the thread waiting for it gets :class:`concurrent.futures.CancelledError`, so an
        ``execute_local`` answers UNKNOW and a ``check_local`` UNKNOW).  Returns how many.  The
        app's close calls it when awaited sends outlive the close timeout."""
        with self._lock:
            pending = list(self._pending)
        return sum(1 for future in pending if future.cancel())

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new coroutines, wait up to ``timeout`` for those running, then stop an owned
        loop.  Returns True when none was left running.  Idempotent.

        Raises:
            LifecycleError: called on the loop's own thread while coroutines still run (waiting
                there would block them forever): use ``await app.aclose()``.
        """
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        if pending and self.in_loop_thread():
            raise LifecycleError(
                f"{len(pending)} listener coroutines still run on this event loop, and closing "
                "from the loop's thread would block them; use `await app.aclose()` (or "
                "`async with app:`)"
            )
        done = True
        if pending:
            _, not_done = wait_futures(pending, timeout=timeout)
            done = not not_done
            if not done:
                log.warning(
                    "%d listener coroutines still running after %.1fs; cancelling them",
                    len(not_done),
                    timeout,
                )
                for future in not_done:
                    future.cancel()
        thread = self._thread
        if thread is not None and thread.is_alive():
            if not done:  # the cancelled ones run their cleanup (awaited rollbacks) first
                self._settle(timeout)
            self.loop.call_soon_threadsafe(self.loop.stop)
            thread.join(timeout)
            if not thread.is_alive():
                self.loop.close()
        return done

    def _settle(self, timeout: float | None) -> None:
        """Let the tasks of an owned loop (all of them are listener coroutines) end, up to
        ``timeout``: stopping the loop right after cancelling them would destroy them pending,
        their ``finally`` blocks never run on the loop (an awaited rollback there raises)."""

        async def settle() -> None:
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            if tasks:
                await asyncio.wait(tasks, timeout=timeout)

        try:
            asyncio.run_coroutine_threadsafe(settle(), self.loop).result(timeout)
        except Exception:  # the loop stops anyway; say that the coroutines lingered
            log.warning(
                "listener coroutines cancelled by the close did not end within %ss; stopping "
                "the loop under them (their cleanup does not run)",
                timeout,
                exc_info=True,
            )

    def __repr__(self) -> str:
        kind = "own thread" if self.owns_loop else "bound"
        return f"<LoopBridge {kind} pending={self.pending} closed={self._closed}>"


class _Timed:
    """Awaitable that drives a coroutine step by step and times each step (module docstring).

    Every value the coroutine yields (asyncio futures) passes through unchanged, and every value
    or exception sent back (results, cancellation) goes to the coroutine, so to asyncio it is the
    coroutine itself."""

    __slots__ = ("bridge", "coro", "name")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str, bridge: LoopBridge) -> None:
        self.coro = coro
        self.name = name
        self.bridge = bridge

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, limit = self.coro, self.bridge.slow_step
        value: Any = None
        error: BaseException | None = None
        while True:
            began = time.perf_counter()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self._timed(began, limit)
                return stop.value
            except BaseException:
                self._timed(began, limit)
                raise
            self._timed(began, limit)
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine (cancellation)
                value, error = None, exc

    def _timed(self, began: float, limit: float) -> None:
        spent = time.perf_counter() - began
        if spent > limit:
            self.bridge._slow(self.name, spent)
