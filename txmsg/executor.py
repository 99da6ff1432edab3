"""A thread pool with Java ``ThreadPoolExecutor`` semantics.

``concurrent.futures.ThreadPoolExecutor`` has one size and an unbounded queue.  RocketMQ users
configure listeners the Java way (rocketmq-spring's ``corePoolSize``/``maximumPoolSize``/
``keepAliveTime``/``blockingQueueSize``), and the behaviour they expect is Java's:

1. while fewer than ``core_pool_size`` threads exist, every submit starts a new thread;
2. then tasks wait in a queue bounded by ``queue_capacity``;
3. only when that queue is full does the pool grow past core, up to ``max_pool_size``;
4. threads above core retire after ``keep_alive`` seconds without work;
5. when ``max_pool_size`` threads are busy and the queue is full, the rejection policy decides:
   ``abort`` raises :class:`~txmsg.errors.RejectedError`, ``caller_runs`` runs the task in the
   submitting thread, ``unknow`` answers ``LocalTransactionState.UNKNOW`` (the broker asks again
   later, which is the right back-pressure for a check-back).

Defaults (8 / 16 / 60 s / 256, ``unknow``) avoid rocketmq-spring's 1 / 1 / queue 2000, where one
slow check stalls every other check of the group behind it.

Written on ``threading`` primitives: one lock guards the queue, the worker set and the figures.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from txmsg.errors import RejectedError
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.executor")


class RejectionPolicy(enum.Enum):
    """What happens to a task when max threads are busy and the queue is full."""

    ABORT = "abort"
    """Raise :class:`~txmsg.errors.RejectedError` to the submitter."""
    CALLER_RUNS = "caller_runs"
    """Run the task in the submitting thread (slows the producer down: natural back-pressure)."""
    UNKNOW = "unknow"
    """Answer ``LocalTransactionState.UNKNOW`` without running the task; the broker checks again."""


class ExecutorConfig(BaseModel):
    """Sizing of one listener's executor, with Java ``ThreadPoolExecutor`` meaning.

    ``keep_alive`` is in seconds (rocketmq-spring's ``keepAliveTime`` is milliseconds).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    core_pool_size: int = Field(default=8, ge=0)
    max_pool_size: int = Field(default=16, ge=1)
    keep_alive: float = Field(default=60.0, ge=0.0)
    queue_capacity: int = Field(default=256, ge=0)
    rejection: RejectionPolicy = RejectionPolicy.UNKNOW

    @field_validator("rejection", mode="before")
    @classmethod
    def _policy_spelling(cls, value: object) -> object:
        """Accept "CALLER_RUNS", "caller-runs" and "unknown" as well as the canonical values."""
        if isinstance(value, str):
            text = value.strip().lower().replace("-", "_")
            return "unknow" if text == "unknown" else text
        return value

    @model_validator(mode="after")
    def _core_within_max(self) -> Self:
        if self.core_pool_size > self.max_pool_size:
            raise ValueError(
                f"core_pool_size ({self.core_pool_size}) must be <= max_pool_size "
                f"({self.max_pool_size}): raise max_pool_size or lower core_pool_size"
            )
        return self


@dataclass(frozen=True)
class ExecutorStats:
    """A consistent snapshot of an executor's figures (taken under its lock)."""

    active: int
    """Threads running a task right now."""
    queued: int
    """Tasks waiting in the queue."""
    completed: int
    """Tasks the pool's threads finished (successfully or with an exception)."""
    rejected: int
    """Submissions the pool could not take, whatever the policy then did with them."""
    largest_pool_size: int
    """The most threads the pool ever had at once."""
    pool_size: int
    """Threads alive now."""
    caller_ran: int = 0
    """Rejected tasks the ``caller_runs`` policy ran in the submitting thread."""


class _Task:
    __slots__ = ("future", "fn", "args", "kwargs")

    def __init__(
        self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.future = future
        self.fn = fn
        self.args = args
        self.kwargs = kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


class TxExecutor:
    """Thread pool with Java ``ThreadPoolExecutor`` semantics (see the module docstring).

    Parameters:
        config: sizes and rejection policy.
        name: prefix of the worker thread names (``<name>-<n>``), shown in logs and stack dumps.

    Worker threads are daemons so a forgotten executor never blocks interpreter exit; call
    :meth:`shutdown` (``TxMsg.close()`` does) to let queued work finish first.
    """

    def __init__(self, config: ExecutorConfig | None = None, name: str = "txmsg") -> None:
        self.config = config or ExecutorConfig()
        self.name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: deque[_Task] = deque()
        self._workers: set[threading.Thread] = set()
        self._idle = 0
        self._active = 0
        self._completed = 0
        self._rejected = 0
        self._caller_ran = 0
        self._largest = 0
        self._shutdown = False
        self._seq = itertools.count(1)

    # ---- submitting -----------------------------------------------------------------------------
    @property
    def policy(self) -> RejectionPolicy:
        """The configured rejection policy."""
        return self.config.rejection

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run ``fn(*args, **kwargs)`` on the pool; apply the rejection policy when it is full.

        Under ``unknow`` a rejected task is not run and its future resolves to
        ``LocalTransactionState.UNKNOW``.  Raises :class:`RejectedError` under ``abort``, and
        under every policy once the executor is shut down.
        """
        future = self.offer(fn, *args, **kwargs)
        if future is not None:
            return future
        if self._shutdown:
            raise RejectedError(f"executor {self.name!r} is shut down; submit before close()")
        policy = self.config.rejection
        if policy is RejectionPolicy.CALLER_RUNS:
            return self.run_in_caller(fn, *args, **kwargs)
        if policy is RejectionPolicy.UNKNOW:
            done: Future[Any] = Future()
            done.set_result(LocalTransactionState.UNKNOW)
            return done
        raise RejectedError(self.saturation_message())

    def offer(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any] | None:
        """Like :meth:`submit` but return None instead of applying the rejection policy.

        Callers that need policy-specific handling (the check dispatcher, async sends) use this
        and decide themselves.  A None still counts in ``rejected``.
        """
        task = _Task(Future(), fn, args, kwargs)
        with self._lock:
            if self._shutdown:
                self._rejected += 1
                return None
            cfg = self.config
            if len(self._workers) < cfg.core_pool_size:
                self._add_worker(task)
            elif len(self._queue) < cfg.queue_capacity + self._idle:
                # The queue takes it.  Idle threads count as hand-off slots, so that
                # queue_capacity=0 behaves like Java's SynchronousQueue.
                self._queue.append(task)
                self._work.notify()
                if not self._workers:  # core_pool_size=0: make sure someone runs it
                    self._add_worker(None)
            elif len(self._workers) < cfg.max_pool_size:
                self._add_worker(task)
            else:
                self._rejected += 1
                return None
        return task.future

    def run_in_caller(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Run a rejected task in this thread (the ``caller_runs`` policy); counted in stats."""
        task = _Task(Future(), fn, args, kwargs)
        with self._lock:
            self._caller_ran += 1
        task.run()
        return task.future

    def saturation_message(self) -> str:
        """Why a task was rejected, and what to change."""
        cfg = self.config
        return (
            f"executor {self.name!r} is saturated: {cfg.max_pool_size} threads busy and "
            f"{cfg.queue_capacity} tasks queued; raise max_pool_size/queue_capacity or use "
            "rejection='caller_runs' or 'unknow'"
        )

    # ---- workers (called with the lock held) ----------------------------------------------------
    def _add_worker(self, first: _Task | None) -> None:
        thread = threading.Thread(
            target=self._worker_loop,
            args=(first,),
            name=f"{self.name}-{next(self._seq)}",
            daemon=True,
        )
        self._workers.add(thread)
        self._largest = max(self._largest, len(self._workers))
        thread.start()

    def _worker_loop(self, first: _Task | None) -> None:
        task = first
        while True:
            if task is None:
                task = self._next_task()
                if task is None:
                    return
            with self._lock:
                self._active += 1
            try:
                task.run()
            finally:
                with self._lock:
                    self._active -= 1
                    self._completed += 1
            task = None

    def _next_task(self) -> _Task | None:
        """Block for the next task; None means this thread retires (already removed)."""
        me = threading.current_thread()
        deadline: float | None = None
        with self._work:
            while True:
                if self._queue:
                    return self._queue.popleft()
                if self._shutdown:
                    self._retire(me)
                    return None
                if len(self._workers) > self.config.core_pool_size:
                    now = time.monotonic()
                    if deadline is None:
                        deadline = now + self.config.keep_alive
                    if now >= deadline:
                        self._retire(me)
                        return None
                    self._wait(deadline - now)
                else:
                    deadline = None
                    self._wait(None)

    def _wait(self, timeout: float | None) -> None:
        self._idle += 1
        try:
            self._work.wait(timeout)
        finally:
            self._idle -= 1

    def _retire(self, me: threading.Thread) -> None:
        self._workers.discard(me)
        self._work.notify_all()  # shutdown(wait=True) waits on the same condition

    # ---- figures and lifecycle -----------------------------------------------------------------
    def stats(self) -> ExecutorStats:
        """Live figures, consistent with each other."""
        with self._lock:
            return ExecutorStats(
                active=self._active,
                queued=len(self._queue),
                completed=self._completed,
                rejected=self._rejected,
                largest_pool_size=self._largest,
                pool_size=len(self._workers),
                caller_ran=self._caller_ran,
            )

    @property
    def is_shutdown(self) -> bool:
        """True once shutdown() was called (threads may still be finishing)."""
        return self._shutdown

    def shutdown(
        self, wait: bool = True, timeout: float | None = None, *, cancel_pending: bool = False
    ) -> bool:
        """Stop taking tasks; queued tasks still run unless ``cancel_pending``.

        With ``wait``, block until every thread has exited or ``timeout`` seconds passed.
        Returns True when all threads are gone.
        """
        with self._work:
            self._shutdown = True
            if cancel_pending:
                while self._queue:
                    self._queue.popleft().future.cancel()
            self._work.notify_all()
            if not wait:
                return not self._workers
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._workers:
                if deadline is None:
                    self._work.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning(
                        "executor %s: %d threads still busy after %.1fs shutdown wait",
                        self.name,
                        len(self._workers),
                        timeout,
                    )
                    return False
                self._work.wait(remaining)
            return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True)

    def __repr__(self) -> str:
        s = self.stats()
        c = self.config
        return (
            f"<TxExecutor {self.name} core={c.core_pool_size} max={c.max_pool_size} "
            f"queue={s.queued}/{c.queue_capacity} pool={s.pool_size} active={s.active}>"
        )
