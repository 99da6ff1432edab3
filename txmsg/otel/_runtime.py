"""Loading OpenTelemetry once, on first use, and txmsg's instruments on the global providers.

Why lazily: ``import txmsg`` must stay as fast without the extra as with it, so nothing here runs
until a producer, check dispatcher or consumer of a started app asks for it.  Why the global
providers, through the API only: the application chooses the SDK and exporters (or none); the
API's proxy tracer and meter forward to a provider set later, so the order of ``app.start()`` and
the SDK's set-up does not matter.  Without the ``opentelemetry-api`` package :func:`otel` is None
and every hook is a no-op.

Observable instruments (executor gauges, parked keys, the outbox) read their figures when the
SDK collects: the parts that have them register a reader with :func:`watch` and remove it with
:func:`unwatch` when they close.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from txmsg.otel import names

log = logging.getLogger("txmsg.otel")

SCHEMA_URL = "https://opentelemetry.io/schemas/1.26.0"
"""The semantic conventions version whose messaging names txmsg follows."""

_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
"""The conventions' advice for messaging durations (seconds)."""

Reading = Iterable[tuple[float, Mapping[str, Any]]]
"""What a watcher returns: (value, attributes) per group."""

_lock = threading.Lock()
_loaded: Otel | None = None
_tried = False
_watchers: dict[str, dict[int, Callable[[], Reading]]] = {}
_tokens = itertools.count(1)


class Otel:
    """The OpenTelemetry API modules and txmsg's instruments (one per process)."""

    def __init__(self) -> None:
        from opentelemetry import context, metrics, propagate, trace  # noqa: PLC0415 - lazy (module docstring)
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode  # noqa: PLC0415

        self.context = context
        self.propagate = propagate
        self.trace = trace
        self.Link = Link
        self.PRODUCER = SpanKind.PRODUCER
        self.CONSUMER = SpanKind.CONSUMER
        self.Status = Status
        self.ERROR = StatusCode.ERROR
        version = _version()
        self.tracer = trace.get_tracer("txmsg", version, schema_url=SCHEMA_URL)
        self._no_sdk = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._tracing = False
        meter = metrics.get_meter("txmsg", version, schema_url=SCHEMA_URL)
        unit = {name: u for name, (_, u) in names.INSTRUMENTS.items()}

        def counter(name: str, description: str) -> Any:
            return meter.create_counter(name, unit=unit[name], description=description)

        def histogram(name: str, description: str) -> Any:
            return meter.create_histogram(
                name,
                unit=unit[name],
                description=description,
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )

        self.operation_duration = Durations(
            histogram(names.OPERATION_DURATION, "Duration of a send")
        )
        self.process_duration = Durations(
            histogram(names.PROCESS_DURATION, "Duration of a delivery")
        )
        self.check_duration = Durations(
            histogram(names.CHECK_DURATION, "Check-back arrival to answer")
        )
        self.sent = Tally(self.operation_duration)
        self.consumed = Tally(self.process_duration)
        self.checks = Tally(self.check_duration)
        self.discards = Tally()
        for name, tally, description in (
            (names.SENT_MESSAGES, self.sent, "Messages handed to the broker"),
            (names.CONSUMED_MESSAGES, self.consumed, "Deliveries handed to listeners"),
            (names.CHECKS, self.checks, "Check-backs answered"),
            (names.DISCARDS, self.discards, "Discarded half messages, by the rescuer's outcome"),
        ):
            meter.create_observable_counter(
                name, callbacks=[tally.observe], unit=unit[name], description=description
            )
        observed = {
            names.LOCAL_TRANSACTIONS: (
                "counter",
                "execute_local answers of sends that reached the broker",
            ),
            names.EXECUTOR_QUEUED: ("gauge", "Tasks waiting for an executor thread"),
            names.EXECUTOR_ACTIVE: ("gauge", "Executor threads running a task"),
            names.EXECUTOR_REJECTED: ("counter", "Tasks the executor refused"),
            names.PARKED_KEYS: ("gauge", "Sharding keys parked by an orderly consumer group"),
            names.OUTBOX_UNSENT: ("gauge", "Outbox rows not sent yet"),
            names.OUTBOX_OLDEST_AGE: ("gauge", "Age of the oldest unsent outbox row"),
        }
        for name, (kind, description) in observed.items():
            create = (
                meter.create_observable_counter
                if kind == "counter"
                else meter.create_observable_gauge
            )
            create(name, callbacks=[_observer(name)], unit=unit[name], description=description)

    def tracing(self) -> bool:
        """True once the application has set a tracer provider (an SDK) of its own.

        Until then every span txmsg would start is the API's non-recording one, so the hooks
        skip the span's work altogether (``benchmarks/otel_overhead.py``'s ``send_ratio_api``),
        unless a span context is already current or carried by the message (the API alone
        still passes a context on).  Asked per operation, through the public
        ``get_tracer_provider()``, so a provider set after ``app.start()`` is seen at once;
        the answer is kept once True (the global provider is set once)."""
        if self._tracing:
            return True
        if isinstance(self.trace.get_tracer_provider(), self._no_sdk):
            return False
        self._tracing = True
        return True


class Tally:
    """The figures of one counter, added on the hot paths and read when the SDK collects.

    Why not the SDK's synchronous counter: each ``add`` there builds a measurement, validates and
    hashes its attributes and offers an exemplar, several microseconds on the sending thread
    with the GIL held, for every send and delivery (``benchmarks/otel_overhead.py``); a dict
    entry under a lock costs a fraction of that, and the exported totals are the same (the
    SDK turns the cumulative observations into deltas where a reader asks for them).  The
    counter's histogram twin (the duration) still records each value with its exemplar."""

    __slots__ = ("_counts", "_durations", "_lock")

    def __init__(self, durations: Durations | None = None) -> None:
        self._durations = durations
        """The histogram twin, recorded into the SDK when this counter is observed."""
        self._lock = threading.Lock()
        self._counts: dict[Hashable, list[Any]] = {}
        """key -> [total, attributes]: the key is what tells the attribute sets apart (the
        mappings themselves are not hashable)."""

    def add(self, key: Hashable, attributes: Mapping[str, Any], amount: int = 1) -> None:
        """Add ``amount`` to the total of ``attributes`` (``key`` names them, cheaply)."""
        with self._lock:
            entry = self._counts.get(key)
            if entry is None:
                self._counts[key] = [amount, attributes]
            else:
                entry[0] += amount

    def observe(self, options: Any) -> list[Any]:
        """The totals so far (the observable counter's callback)."""
        from opentelemetry.metrics import Observation  # noqa: PLC0415 - loaded by now

        if self._durations is not None:
            self._durations.flush()
        with self._lock:
            entries = [(total, attributes) for total, attributes in self._counts.values()]
        return [Observation(total, attributes) for total, attributes in entries]


class Durations:
    """The values of one duration histogram, held until the SDK collects, then recorded into it
    in one go (by the counter twin's callback, which the SDK runs before it reads its storages).

    Why: the SDK's ``record`` builds a measurement, cleans and hashes its attributes and offers
    an exemplar under locks, about half of what a sampled-out send's telemetry costs on the
    sending thread (docs/guide/observability.md, *What it costs*); appending to a deque costs a
    fraction of that, and a collection records the values back to back.  The exported
    histograms are the same; an exemplar (kept for sampled spans: the context goes along)
    carries the time of the collection instead of the send's.  At most :data:`HELD` values wait:
    beyond that (no reader collecting, or a long export interval) the sending thread records
    them itself."""

    __slots__ = ("_histogram", "_pending")

    HELD = 4096

    def __init__(self, histogram: Any) -> None:
        self._histogram = histogram
        self._pending: collections.deque[tuple[float, Mapping[str, Any], Any]] = collections.deque()

    def record(self, value: float, attributes: Mapping[str, Any], context: Any = None) -> None:
        """Hold ``value`` (``context``: the span's, for an exemplar; None for none)."""
        pending = self._pending
        pending.append((value, attributes, context))  # deque: safe across threads
        if len(pending) >= self.HELD:
            self.flush()

    def flush(self) -> None:
        """Record every value held into the SDK's histogram."""
        pending, record = self._pending, self._histogram.record
        while True:
            try:
                value, attributes, context = pending.popleft()
            except IndexError:
                return
            record(value, attributes, context=context)


def _version() -> str:
    import importlib.metadata  # noqa: PLC0415 - once, when telemetry loads

    try:
        return importlib.metadata.version("txmsg")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def otel() -> Otel | None:
    """The loaded API and instruments; None when ``opentelemetry-api`` is not installed."""
    global _loaded, _tried
    if _tried:
        return _loaded
    with _lock:
        if not _tried:
            try:
                _loaded = Otel()
            except ImportError:
                _loaded = None
            _tried = True
    return _loaded


def watch(name: str, read: Callable[[], Reading]) -> int:
    """Register ``read`` as a source of observable instrument ``name``; returns a token for
    :func:`unwatch`.  ``read`` runs when the SDK collects (any thread); it must be quick, and
    what it raises is logged, not propagated (one broken source must not hide the others)."""
    token = next(_tokens)
    with _lock:
        _watchers.setdefault(name, {})[token] = read
    return token


def unwatch(token: int) -> None:
    """Remove a source registered with :func:`watch` (unknown tokens are ignored)."""
    with _lock:
        for sources in _watchers.values():
            sources.pop(token, None)


def _observer(name: str) -> Callable[[Any], list[Any]]:
    def observe(options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation  # noqa: PLC0415 - loaded by now

        with _lock:
            sources = list(_watchers.get(name, {}).values())
        out: list[Any] = []
        for read in sources:
            try:
                out.extend(Observation(value, dict(attrs)) for value, attrs in read())
            except Exception:  # logged; the other sources still report
                log.warning("could not read %s", name, exc_info=True)
        return out

    return observe
