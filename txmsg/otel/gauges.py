"""Sources of txmsg's observable instruments: figures read when the SDK collects.

Why observed rather than counted as they change: the figures live where they are kept already
(the executor's counters, the parked keys and outbox rows in the service's database), so the
metrics cannot drift from ``stats()`` - both read the same place.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

from txmsg.otel import names
from txmsg.otel._runtime import Reading, otel, unwatch, watch


def watch_executor(group: str, executor: Any) -> list[int]:
    """Report ``executor.stats()`` (queued, active, rejected) for producer ``group``; returns
    the tokens for :func:`unwatch_all`.  Held weakly: a producer never closed does not leak."""
    if otel() is None:  # no API: nothing would read them
        return []
    try:
        ref: Callable[[], Any] = weakref.ref(executor)
    except TypeError:  # an executor without weak references: held for the producer's life
        ref = lambda: executor  # noqa: E731 - the same call shape as the weak reference
    attributes = {names.PRODUCER_GROUP: group}

    def reading(field: str) -> Callable[[], Reading]:
        def read() -> Reading:
            current = ref()
            return [] if current is None else [(getattr(current.stats(), field), attributes)]

        return read

    return [
        watch(names.EXECUTOR_QUEUED, reading("queued")),
        watch(names.EXECUTOR_ACTIVE, reading("active")),
        watch(names.EXECUTOR_REJECTED, reading("rejected")),
    ]


def watch_local_transactions(group: str, counts: Callable[[], Mapping[str, int]]) -> list[int]:
    """Report ``counts()`` (result -> count: the producer's own commit / rollback / unknown
    counts, those of ``stats()``) as ``txmsg.local_transactions`` of producer ``group``.  Read
    when collected rather than added per send: no cost on the sending thread."""
    if otel() is None:
        return []
    try:  # a bound method is held weakly, like the executor above
        ref: Callable[[], Callable[[], Mapping[str, int]] | None] = weakref.WeakMethod(counts)
    except TypeError:
        ref = lambda: counts  # noqa: E731 - the same call shape as the weak reference

    def read() -> Reading:
        current = ref()
        if current is None:
            return []
        return [
            (n, {names.PRODUCER_GROUP: group, names.LOCAL_RESULT: result})
            for result, n in current().items()
        ]

    return [watch(names.LOCAL_TRANSACTIONS, read)]


def watch_parked_keys(group: str, count: Callable[[], int]) -> list[int]:
    """Report ``count()`` (the parked keys of consumer ``group``, read from its database)."""
    if otel() is None:
        return []
    attributes = {names.CONSUMER_GROUP: group}
    return [watch(names.PARKED_KEYS, lambda: [(count(), attributes)])]


def watch_outbox(group: str, backlog: Callable[[], tuple[int, float | None]]) -> list[int]:
    """Report an outbox's unsent rows and oldest unsent age (0 when none) for producer
    ``group``; ``backlog()`` reads both (one query per instrument and collection)."""
    if otel() is None:
        return []
    attributes = {names.PRODUCER_GROUP: group}
    return [
        watch(names.OUTBOX_UNSENT, lambda: [(backlog()[0], attributes)]),
        watch(names.OUTBOX_OLDEST_AGE, lambda: [(backlog()[1] or 0.0, attributes)]),
    ]


def unwatch_all(tokens: list[int]) -> None:
    """Stop reporting what :func:`watch_executor` and its siblings registered."""
    for token in tokens:
        unwatch(token)
