"""CPU time of this process split by thread kind, for the benchmarks that compare threads with
an event loop (``benchmarks.async_send``).

A side's throughput on 2 shared cores follows the CPU it spends per operation, and *where* it
spends it says which lever matters: the event loop's thread (one core at most, and every
coroutine waits for it), the threads a send hops through (the send pool, a driver's thread per
connection), or the client's native threads (librocketmq's, which hold no GIL).  Linux keeps each
thread's run time to the nanosecond in ``/proc/self/task/<tid>/schedstat`` (its ``stat`` counts
clock ticks, which threads running 100 µs at a time mostly escape); elsewhere :func:`snapshot`
returns nothing and the split is simply not printed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

_TASKS = "/proc/self/task"
PROCESS = 0
"""The key of :func:`snapshot`'s whole-process figure (no thread has id 0)."""


def _seconds(task: str) -> float | None:
    try:
        with open(f"{task}/schedstat", encoding="ascii") as schedstat:
            return int(schedstat.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):  # the thread ended meanwhile
        return None


def _switches(task: str) -> float | None:
    try:
        with open(f"{task}/status", encoding="ascii") as status:
            return float(
                sum(
                    int(line.split()[1])
                    for line in status
                    if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt"))
                )
            )
    except (OSError, ValueError, IndexError):  # the thread ended meanwhile
        return None


def _per_thread(read: Callable[[str], float | None]) -> dict[int, float]:
    """Thread id -> ``read(its /proc task folder)`` for every live thread that could be read."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return {}
    values: dict[int, float] = {}
    for tid in tids:
        value = read(f"{_TASKS}/{tid}")
        if value is not None:
            values[int(tid)] = value
    return values


def snapshot() -> dict[int, float]:
    """Thread id -> CPU seconds of every live thread of this process, and under ``PROCESS``
    the whole process's (``time.process_time``: threads that ended included)."""
    cpu = _per_thread(_seconds)
    if cpu:
        cpu[PROCESS] = time.process_time()
    return cpu


def switches() -> dict[int, float]:
    """Thread id -> context switches so far (voluntary: it waited, for a lock, the GIL, a
    socket; involuntary: preempted) of every live thread: each cross-thread hand-over of a
    send costs one or more, and on this VM a switch costs more CPU than the Python around it."""
    return _per_thread(_switches)


def split(
    before: Mapping[int, float],
    after: Mapping[int, float],
    kind: Callable[[threading.Thread], str],
) -> dict[str, float]:
    """CPU seconds spent between two snapshots, by ``kind(thread)`` for Python threads,
    ``"native"`` for threads Python does not know (a client library's own) and ``"ended"`` for
    threads that ended before the second snapshot (what the process spent beyond the rest)."""
    named = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
    spent: dict[str, float] = {}
    live = 0.0
    for tid, seconds in after.items():
        if tid == PROCESS:
            continue
        delta = seconds - before.get(tid, 0.0)
        live += max(delta, 0.0)
        if delta <= 0:
            continue
        thread = named.get(tid)
        label = "native" if thread is None else kind(thread)
        spent[label] = spent.get(label, 0.0) + delta
    ended = after.get(PROCESS, 0.0) - before.get(PROCESS, 0.0) - live
    if ended > 0:
        spent["ended"] = ended
    return spent


def render(spent: Mapping[str, float], per: int, *, scale: float = 1e6, digits: int = 0) -> str:
    """``"loop 410 + pool 380 + native 120"``: µs (``scale``) per operation of each kind, largest
    first."""
    parts = sorted(spent.items(), key=lambda item: -item[1])
    return " + ".join(f"{label} {value * scale / per:.{digits}f}" for label, value in parts)
