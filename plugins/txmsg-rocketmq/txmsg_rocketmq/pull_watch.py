"""Seeing which queues a librocketmq push consumer still pulls, and noticing one it stopped pulling.

Why: txmsg's push consumers pull asynchronously, as librocketmq 2.1.0 does by default, because
its synchronous pull never lets the broker hold a pull (no suspend flag) and so re-pulls every
idle queue back to back: an idle listener then keeps a core busy in the app and most of one in
the broker (docs/librocketmq-hazards.md #5).  The asynchronous path has one fault instead: after
a rebalance drops a queue and takes it back while the old pull request is still referenced, the
queue is never pulled again by that process.  That state is visible from outside: the client's
own ``ConsumerRunningInfo`` (what it reports when a broker or ``mqadmin consumerStatus`` asks)
lists every queue it holds with the time of its last pull, and a healthy queue is pulled again
at least every ``15 s`` (a held pull) + the pull's timeout: one whose last pull is much older is
stalled.  :class:`~txmsg_rocketmq.consumer.PushConsumer` checks that and restarts its native
consumer when it sees one (the restart builds a new pull callback table, which is the repair).

The C API has no call for it; as for :func:`~txmsg_rocketmq.native.set_pull`, the handle is
the C++ ``DefaultMQPushConsumer``, whose only data member after its vtable pointer is its
``DefaultMQPushConsumerImpl*`` (include/DefaultMQPushConsumer.h of 2.1.0), and the exported C++
functions are called on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .native import Native

log = logging.getLogger("txmsg.rocketmq")

RUNNING_INFO_SYMBOL = "_ZN8rocketmq25DefaultMQPushConsumerImpl22getConsumerRunningInfoEv"
ENCODE_SYMBOL = "_ZN8rocketmq19ConsumerRunningInfo6encodeB5cxx11Ev"
DELETE_SYMBOL = "_ZN8rocketmq19ConsumerRunningInfoD0Ev"  # the deleting destructor
IMPL_OFFSET = ctypes.sizeof(ctypes.c_void_p)
"""Where ``DefaultMQPushConsumer::impl`` sits: right after the vtable pointer."""

STALLED_AFTER = 60.0
"""Seconds since a held queue's last pull after which it counts as stalled.  An asynchronous pull
is held by the broker for at most 15 s and times out on the client after 30 s; every failure,
a full local cache and an orderly queue whose lock was refused retry within 3 s, each setting the
time again.  Twice the longest healthy gap."""

# librocketmq writes mqTable by hand, keyed by the queue's JSON object (not valid JSON as a
# whole): {"brokerName" : "b", "queueId" : 0, "topic" : "T"}:{... "lastPullTimestamp" : "123" ...}
_ENTRY = re.compile(
    r'\{\s*"brokerName"\s*:\s*"(?P<broker>[^"]*)"\s*,\s*"queueId"\s*:\s*(?P<queue>-?\d+)\s*,'
    r'\s*"topic"\s*:\s*"(?P<topic>[^"]*)"\s*\}\s*:\s*\{(?P<info>[^{}]*)\}'
)
_LAST_PULL = re.compile(r'"lastPullTimestamp"\s*:\s*"?(?P<ms>-?\d+)"?')


@dataclass(frozen=True)
class HeldQueue:
    """A queue the consumer holds, and when (ms since the epoch, 0: never) it last pulled it."""

    topic: str
    broker: str
    queue_id: int
    last_pull_ms: int


class _StdString(ctypes.Structure):
    """libstdc++'s ``std::string`` (the C++11 ABI): pointer, length, then 16 bytes that hold
    short strings in place or the capacity."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("size", ctypes.c_size_t),
        ("local", ctypes.c_char * 16),
    ]


class PullWatch:
    """Reads the queues a push consumer holds (None from :meth:`held` if the library lacks the
    symbols: then nothing is watched)."""

    def __init__(self, native: Native) -> None:
        self._functions: tuple[Any, Any, Any, Any] | None = None
        dll = native.dll
        try:
            running_info = getattr(dll, RUNNING_INFO_SYMBOL)
            encode = getattr(dll, ENCODE_SYMBOL)
            delete = getattr(dll, DELETE_SYMBOL)
        except AttributeError:
            return
        running_info.argtypes, running_info.restype = [ctypes.c_void_p], ctypes.c_void_p
        # a std::string returned by value: the caller's buffer is the hidden first argument
        encode.argtypes = [ctypes.POINTER(_StdString), ctypes.c_void_p]
        encode.restype = ctypes.c_void_p
        delete.argtypes, delete.restype = [ctypes.c_void_p], None
        name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
        try:
            operator_delete = ctypes.CDLL(name)._ZdlPv
        except (OSError, AttributeError):
            return
        operator_delete.argtypes, operator_delete.restype = [ctypes.c_void_p], None
        self._functions = (running_info, encode, delete, operator_delete)

    @property
    def available(self) -> bool:
        """Whether this library's consumers can be watched (its C++ symbols were found)."""
        return self._functions is not None

    def report(self, handle: int) -> str | None:
        """The consumer's ``ConsumerRunningInfo`` as librocketmq encodes it.  Call only on a
        started consumer that is not being shut down (the caller holds its stop lock)."""
        if self._functions is None:
            return None
        running_info, encode, delete, operator_delete = self._functions
        impl = ctypes.c_void_p.from_address(handle + IMPL_OFFSET).value
        if not impl:
            return None
        info = running_info(impl)
        if not info:
            return None
        try:
            text = _StdString()
            encode(ctypes.byref(text), info)
            try:
                return ctypes.string_at(text.data, text.size).decode("utf-8", "replace")
            finally:
                local = ctypes.addressof(text) + _StdString.local.offset
                if text.data and text.data != local:
                    operator_delete(text.data)
        finally:
            delete(info)

    def held(self, handle: int) -> list[HeldQueue] | None:
        """The queues the consumer holds now (dropped ones are not listed)."""
        report = self.report(handle)
        if report is None:
            return None
        return parse(report)


def parse(report: str) -> list[HeldQueue]:
    """The held queues of an encoded ``ConsumerRunningInfo``."""
    queues = []
    for entry in _ENTRY.finditer(report):
        last = _LAST_PULL.search(entry["info"])
        queues.append(
            HeldQueue(
                topic=entry["topic"],
                broker=entry["broker"],
                queue_id=int(entry["queue"]),
                last_pull_ms=int(last["ms"]) if last else 0,
            )
        )
    return queues


def stalled(
    queues: list[HeldQueue],
    seen: dict[tuple[str, str, int], tuple[int, float]],
    now: float,
    stall_after: float = STALLED_AFTER,
) -> list[HeldQueue]:
    """The queues whose last pull time has not changed for ``stall_after`` s of ``now`` (a
    monotonic clock: a step of the wall clock neither restarts nor hides anything).  ``seen``
    holds each queue's last pull time and when it was first seen with it; updated here, queues
    no longer held are forgotten."""
    keys = set()
    late = []
    for queue in queues:
        key = (queue.topic, queue.broker, queue.queue_id)
        keys.add(key)
        previous = seen.get(key)
        if previous is None or previous[0] != queue.last_pull_ms:
            seen[key] = (queue.last_pull_ms, now)
        elif now - previous[1] > stall_after:
            late.append(queue)
    for key in [k for k in seen if k not in keys]:
        del seen[key]
    return late


WATCH_EVERY = 10.0
"""Seconds between two looks at a consumer's queues."""


class StallWatcher:
    """A daemon thread that looks at a consumer's held queues every :data:`WATCH_EVERY` s and
    calls ``restart`` when one has not been pulled for ``stall_after`` s.

    ``look`` returns the held queues (None: nothing to look at now, e.g. between a failed restart
    and the next); it and ``restart`` are the consumer's, which serialise them with its close.
    """

    def __init__(
        self,
        name: str,
        look: Callable[[], list[HeldQueue] | None],
        restart: Callable[[list[HeldQueue]], None],
        *,
        stall_after: float = STALLED_AFTER,
        every: float = WATCH_EVERY,
    ) -> None:
        self._look = look
        self._restart = restart
        self.stall_after = stall_after
        self.every = every
        self._seen: dict[tuple[str, str, int], tuple[int, float]] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"txmsg-pull-watch-{name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                queues = self._look()
                if queues is None:
                    continue
                late = stalled(queues, self._seen, time.monotonic(), self.stall_after)
                if late and not self._done.is_set():
                    self._seen.clear()  # the next restart needs another stall_after unchanged
                    self._restart(late)
            except Exception:  # a watcher that died would stop repairing
                log.exception(
                    "pull watch of %s failed; looking again in %.0f s",
                    self._thread.name,
                    self.every,
                )

    def stop(self) -> None:
        """Stop looking (returns at once; a look under way ends with the consumer's lock)."""
        self._done.set()
