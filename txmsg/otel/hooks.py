"""The hooks the core calls where sends, check-backs and deliveries pass.

One object per operation, each with a no-op twin for when OpenTelemetry is not installed (the
core calls the same methods either way, so it has no ``if`` of its own):

* :func:`sending` - a ``send <topic>`` PRODUCER span around a send (``execute_local`` of a
  transactional send runs inside it, as its current span); the W3C trace context is written into
  the message's user properties; the send counter and duration histogram.
* :class:`CheckTelemetry` - per check dispatcher: a ``check <topic>`` span around each
  ``check_local`` run, linked to the send whose context the half message carries; the check
  counter and the arrival-to-answer histogram.
* :func:`processing` - wraps a listener's backend handler: a ``process <topic>`` CONSUMER span,
  child of (and linked to) the producer's context taken from the message; retries, dead letters
  and parked keys become span events; the consumed counter and the process histogram.
* :func:`record_exception`, :func:`add_event` - for code that runs inside those spans (exception
  safety, orderly retries and parking).

Telemetry never breaks messaging: these calls do not raise into the core.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from txmsg.message import Message, OutgoingMessage
from txmsg.otel import names
from txmsg.otel._runtime import Otel, otel
from txmsg.states import LocalTransactionState

log = logging.getLogger("txmsg.otel")

_RESULTS: dict[object, str] = {
    LocalTransactionState.COMMIT: "commit",
    LocalTransactionState.ROLLBACK: "rollback",
    LocalTransactionState.UNKNOW: "unknown",
}
_TRACEPARENT = names.TRACE_PROPERTIES[0]

_errors: ContextVar[list[str] | None] = ContextVar("txmsg_otel_errors", default=None)
"""Error types recorded while a delivery is being processed (its ``error.type``)."""


def result_name(state: object) -> str:
    """``commit`` / ``rollback`` / ``unknown``: how metrics and spans name an answer."""
    return _RESULTS.get(state, "unknown")


def error_type(exc: BaseException) -> str:
    """``error.type`` of an exception: its class name (low cardinality, as the conventions ask)."""
    return type(exc).__qualname__


class _Route:
    """What every send of one producer group to one topic shares: the span's name and base
    attributes, the metric attributes and the tally key of a successful send (built once, see
    :func:`_route`)."""

    __slots__ = ("key", "metric_attributes", "name", "span_attributes")

    def __init__(self, group: str, topic: str, kind: str) -> None:
        self.name = f"send {topic}"
        self.span_attributes: Mapping[str, Any] = {
            names.SYSTEM: names.ROCKETMQ,
            names.DESTINATION: topic,
            names.OPERATION_NAME: "send",
            names.OPERATION_TYPE: "send",
            names.PRODUCER_GROUP: group,
            names.ROCKETMQ_TYPE: kind,
        }
        self.metric_attributes: Mapping[str, Any] = {
            names.SYSTEM: names.ROCKETMQ,
            names.DESTINATION: topic,
            names.OPERATION_NAME: "send",
            names.PRODUCER_GROUP: group,
        }
        self.key: tuple[str, str, str | None] = (group, topic, None)


@functools.lru_cache(maxsize=4096)
def _route(group: str, topic: str, kind: str) -> _Route:
    return _Route(group, topic, kind)


@functools.lru_cache(maxsize=4096)
def _result_attributes(group: str, topic: str, key: str, result: str) -> Mapping[str, Any]:
    return {
        names.SYSTEM: names.ROCKETMQ,
        names.DESTINATION: topic,
        names.PRODUCER_GROUP: group,
        key: result,
    }


@functools.lru_cache(maxsize=4096)
def _process_attributes(group: str, topic: str) -> Mapping[str, Any]:
    return {
        names.SYSTEM: names.ROCKETMQ,
        names.DESTINATION: topic,
        names.OPERATION_NAME: "process",
        names.OPERATION_TYPE: "process",
        names.CONSUMER_GROUP: group,
    }


def _with_error(attributes: Mapping[str, Any], error: str | None) -> Mapping[str, Any]:
    return attributes if error is None else {**attributes, names.ERROR_TYPE: error}


def _message_type(message: OutgoingMessage, transactional: bool) -> str:
    if transactional:
        return "transaction"
    if message.sharding_key is not None:
        return "fifo"
    if message.delay_level is not None or message.deliver_at_ms is not None:
        return "delay"
    return "normal"


def _keys(keys: str | None) -> list[str]:
    return keys.split() if keys else []


def _parent(o: Otel, properties: Mapping[str, str]) -> tuple[Any, list[Any]]:
    """The context a message carries (None if none) and a link to it (empty if none)."""
    if _TRACEPARENT not in properties:
        return None, []
    ctx = o.propagate.extract(properties)
    span_context = o.trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        return None, []
    return ctx, [o.Link(span_context)]


# ---- sends --------------------------------------------------------------------------------------
class Sending:
    """One send: its span and figures.  Use as a context manager around a synchronous send (the
    span is current inside), or call :meth:`end` from a callback (async sends).

    ``message`` is what to hand to the backend: the given one plus the trace context.

    Why it is written the way it is: a send holds the GIL for every call into the SDK (each takes
    a lock and validates what it is given), and sending is CPU-bound in a busy service, so each
    microsecond here is one the send loses (``benchmarks/otel_overhead.py``,
    ``benchmarks/otel_cost.py``).  Per send txmsg makes only the SDK calls a span and its figures
    need: ``start_span`` with every attribute known then, ``inject``, one ``record`` of the
    duration, one ``set_attributes`` with the broker's answer, ``end``.  The context holding the
    span is built once (for the message's trace context, the current span and the duration's
    exemplar); the message count is a :class:`~txmsg.otel._runtime.Tally`, not an SDK
    measurement; what a group's sends to a topic share is built once (:func:`_route`)."""

    __slots__ = (
        "_context",
        "_count",
        "_message_id",
        "_o",
        "_result",
        "_route",
        "_span",
        "_started",
        "_token",
        "message",
    )

    def __init__(
        self,
        o: Otel,
        group: str,
        message: OutgoingMessage,
        *,
        transactional: bool,
        count: int,
    ) -> None:
        self._o = o
        self._count = count
        self._token: object | None = None
        self._message_id: str | None = None
        self._result: str | None = None
        route = _route(group, message.topic, _message_type(message, transactional))
        self._route = route
        self.message = message
        if not o.tracing() and not o.trace.get_current_span().get_span_context().is_valid:
            # no SDK and no context to pass on: the API's span would be the invalid one
            self._span = self._context = None
            self._started = time.perf_counter()
            return
        span = o.tracer.start_span(
            route.name,
            kind=o.PRODUCER,
            attributes=_span_attributes(route.span_attributes, message, count),
        )
        self._span = span
        self._context = context = o.trace.set_span_in_context(span)
        self._started = time.perf_counter()
        # a sampled-out span still has a valid context: consumers keep its sampling decision;
        # no SDK: nothing to carry.  A context the caller set in the properties is kept.
        properties = message.properties
        if _TRACEPARENT not in properties and span.get_span_context().is_valid:
            carrier = dict(properties)
            o.propagate.inject(carrier, context=context)
            self.message = _with_properties(message, carrier)

    def __enter__(self) -> Sending:
        if self._context is not None:
            self._token = self._o.context.attach(self._context)
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self.end(exc)
        finally:
            token, self._token = self._token, None
            if token is not None:
                self._o.context.detach(token)

    def sent(self, message_id: str | None) -> None:
        """The broker's answer: the message id goes on the span."""
        self._message_id = message_id or None

    def local_state(self, state: LocalTransactionState | None) -> None:
        """A transactional send reached the broker and ``execute_local`` answered ``state``
        (on the span; ``txmsg.local_transactions`` reads the producer's own counts)."""
        if state is not None:
            self._result = result_name(state)

    def end(self, error: BaseException | None = None) -> None:
        """Close the span and count the send (failed when ``error`` is given).  Never raises."""
        try:
            self._end(error)
        except Exception:  # telemetry must never fail a send
            log.warning("could not record a send", exc_info=True)

    def _end(self, error: BaseException | None) -> None:
        o, span, route = self._o, self._span, self._route
        elapsed = time.perf_counter() - self._started
        late: dict[str, Any] = {}
        if error is None:
            key, attributes = route.key, route.metric_attributes
        else:
            kind = error_type(error)
            key = (*route.key[:2], kind)
            attributes = {**route.metric_attributes, names.ERROR_TYPE: kind}
            late[names.ERROR_TYPE] = kind
        o.sent.add(key, attributes, self._count)
        if span is None:
            o.operation_duration.record(elapsed, attributes)
            return
        # the span's context (an exemplar) only where the span is recorded
        o.operation_duration.record(
            elapsed, attributes, self._context if span.is_recording() else None
        )
        if self._message_id is not None:
            late[names.MESSAGE_ID] = self._message_id
        if self._result is not None:
            late[names.LOCAL_RESULT] = self._result
        if span.is_recording():
            if error is not None:
                span.record_exception(error)
                span.set_status(o.Status(o.ERROR, f"{late[names.ERROR_TYPE]}: {error}"))
            if late:
                span.set_attributes(late)
        span.end()


def _with_properties(message: OutgoingMessage, properties: Mapping[str, str]) -> OutgoingMessage:
    """``message`` with other user properties: ``dataclasses.replace`` without its cost.

    Why: ``replace`` walks the fields and runs ``__init__`` again on every send, to copy a
    frozen dataclass whose fields are checked already; copying its ``__dict__`` skips that
    (docs/guide/observability.md, *What it costs*).  Falls back to ``replace`` for a message
    without a ``__dict__``."""
    fields = getattr(message, "__dict__", None)
    if fields is None:
        return dataclasses.replace(message, properties=properties)
    copy = object.__new__(type(message))
    copy.__dict__.update(fields)
    copy.__dict__["properties"] = properties
    return copy


class _NoSending:
    """:class:`Sending` without OpenTelemetry: the message unchanged, nothing recorded."""

    __slots__ = ("message",)

    def __init__(self, message: OutgoingMessage) -> None:
        self.message = message

    def __enter__(self) -> _NoSending:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sent(self, message_id: str | None) -> None:
        return None

    def local_state(self, state: LocalTransactionState | None) -> None:
        return None

    def end(self, error: BaseException | None = None) -> None:
        return None


def sending(
    group: str,
    message: OutgoingMessage,
    *,
    transactional: bool = False,
    count: int = 1,
) -> Sending | _NoSending:
    """The telemetry of one send of ``message`` by producer ``group`` (``count`` messages: a
    batch sends several under one span)."""
    o = otel()
    if o is None:
        return _NoSending(message)
    try:
        return Sending(o, group, message, transactional=transactional, count=count)
    except Exception:  # telemetry must never stop a send
        log.warning("could not start the telemetry of a send", exc_info=True)
        return _NoSending(message)


def inject_all(messages: Sequence[OutgoingMessage], like: OutgoingMessage) -> list[OutgoingMessage]:
    """The messages of a batch, each carrying the trace context ``like`` got (the batch's send
    span is their creation context)."""
    context = {k: like.properties[k] for k in names.TRACE_PROPERTIES if k in like.properties}
    if not context:
        return list(messages)
    return [
        m
        if _TRACEPARENT in m.properties
        else dataclasses.replace(m, properties={**m.properties, **context})
        for m in messages
    ]


def _span_attributes(
    base: Mapping[str, Any], message: OutgoingMessage, count: int
) -> Mapping[str, Any]:
    """The send span's attributes: ``base`` plus what this message has (``base`` itself when
    it has nothing more: no copy)."""
    keys, tags = message.keys, message.tags
    if not (
        keys
        or tags
        or count > 1
        or message.sharding_key is not None
        or message.delay_level is not None
        or message.deliver_at_ms is not None
    ):
        return base
    attributes = dict(base)
    if count > 1:
        attributes[names.BATCH_COUNT] = count
    if keys:
        attributes[names.ROCKETMQ_KEYS] = keys.split()
    if tags:
        attributes[names.ROCKETMQ_TAG] = tags
    if message.sharding_key is not None:
        attributes[names.ROCKETMQ_GROUP] = message.sharding_key
    if message.delay_level is not None:
        attributes[names.ROCKETMQ_DELAY_LEVEL] = message.delay_level
    if message.deliver_at_ms is not None:
        attributes[names.ROCKETMQ_DELIVERY_TIMESTAMP] = message.deliver_at_ms
    return attributes


# ---- check-backs --------------------------------------------------------------------------------
class _Checking:
    """The span of one ``check_local`` run (current while it runs)."""

    __slots__ = ("_o", "_span", "_token")

    def __init__(self, o: Otel, group: str, message: Message) -> None:
        self._o = o
        _, links = _parent(o, message.properties)
        attributes: dict[str, Any] = {
            names.SYSTEM: names.ROCKETMQ,
            names.DESTINATION: message.topic,
            names.OPERATION_NAME: "check",
            names.PRODUCER_GROUP: group,
        }
        key = message.transaction_key
        if key:
            attributes[names.MESSAGE_ID] = key
            attributes[names.TRANSACTION_KEY] = key
        if message.keys:
            attributes[names.ROCKETMQ_KEYS] = _keys(message.keys)
        # all at the start: one call into the SDK instead of one per attribute
        self._span = o.tracer.start_span(
            f"check {message.topic}", kind=o.CONSUMER, attributes=attributes, links=links
        )
        self._token = o.context.attach(o.trace.set_span_in_context(self._span))

    def answer(self, state: object) -> None:
        if self._span.is_recording():
            self._span.set_attribute(names.CHECK_RESULT, result_name(state))

    def close(self) -> None:
        try:
            self._o.context.detach(self._token)
        finally:
            self._span.end()


class _NoChecking:
    __slots__ = ()

    def answer(self, state: object) -> None:
        return None

    def close(self) -> None:
        return None


_NO_CHECKING = _NoChecking()


class CheckTelemetry:
    """The check-back telemetry of one producer group (one per check dispatcher)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self._o = otel()
        self.enabled = self._o is not None
        """False without OpenTelemetry: nothing to record."""

    def started(self) -> float:
        """When a check-back arrived (pass it to :meth:`answered`)."""
        return time.perf_counter()

    def answered(self, message: Message, state: object, started: float) -> None:
        """A check-back was answered ``state`` (counted once per check-back received, joined
        ones too, so the count is ``DispatchStats.checks`` once none is in flight)."""
        o = self._o
        if o is None:
            return
        try:
            result = result_name(state)
            attributes = _result_attributes(self.group, message.topic, names.CHECK_RESULT, result)
            o.checks.add((self.group, message.topic, result), attributes)
            o.check_duration.record(time.perf_counter() - started, attributes)
        except Exception:  # telemetry must never change an answer
            log.warning("could not record a check-back", exc_info=True)

    def checking(self, message: Message) -> _Checking | _NoChecking:
        """Open the span of one ``check_local`` run on this thread; ``close()`` it after."""
        o = self._o
        if o is None:
            return _NO_CHECKING
        try:
            return _Checking(o, self.group, message)
        except Exception:  # telemetry must never stop a check
            log.warning("could not start the telemetry of a check-back", exc_info=True)
            return _NO_CHECKING


# ---- deliveries ---------------------------------------------------------------------------------
class Processing:
    """A listener's backend handler with a ``process <topic>`` span and figures per delivery.

    ``close`` (an orderly handler's journal sweeper) is passed through."""

    def __init__(
        self,
        handler: Callable[[Message], bool],
        o: Otel,
        *,
        group: str,
        topic: str,
        max_reconsume: int,
        orderly: bool,
    ) -> None:
        self.handler = handler
        self.group = group
        self.max_reconsume = max_reconsume
        self.orderly = orderly
        self._o = o
        self._attributes = _process_attributes(group, topic)
        self._key = (group, topic)

    def close(self, timeout: float = 10.0) -> None:
        close = getattr(self.handler, "close", None)
        if callable(close):
            close(timeout)

    def __call__(self, message: Message) -> bool:
        if not self._o.tracing() and _TRACEPARENT not in message.properties:
            return self._count_only(message)
        try:
            span, token, errors = self._start(message)
        except Exception:  # telemetry must never stop a delivery
            log.warning("could not start the telemetry of a delivery", exc_info=True)
            return self.handler(message)
        return self._handle(
            message,
            lambda ok, elapsed: self._end(message, span, token, errors, ok, elapsed),
        )

    def _count_only(self, message: Message) -> bool:
        """The delivery's figures without a span: no SDK, and no context to pass on (the API's
        span would be the invalid one; see :meth:`Otel.tracing <txmsg.otel._runtime.Otel.tracing>`)."""
        errors: list[str] = []
        reset = _errors.set(errors)

        def end(ok: bool, elapsed: float) -> None:
            _errors.reset(reset)
            self._figures(_failure(errors, ok), elapsed)

        return self._handle(message, end)

    def _handle(self, message: Message, end: Callable[[bool, float], None]) -> bool:
        """The handler's answer to ``message``; ``end(ok, seconds)`` records the delivery after
        it, with or without a span, and must never change the answer."""
        started = time.perf_counter()
        ok = False
        try:
            ok = self.handler(message)
        finally:
            try:
                end(ok, time.perf_counter() - started)
            except Exception:  # telemetry must never change the answer
                log.warning("could not record a delivery", exc_info=True)
        return ok

    def _figures(self, error: str | None, elapsed: float) -> None:
        """Count the delivery (failed with ``error``) and its duration."""
        attributes = _with_error(self._attributes, error)
        self._o.consumed.add((*self._key, error), attributes)
        self._o.process_duration.record(elapsed, attributes)

    def _start(self, message: Message) -> tuple[Any, Any, list[str]]:
        o = self._o
        parent, links = _parent(o, message.properties)
        attributes: dict[str, Any] = {
            **self._attributes,
            names.ROCKETMQ_CONSUMPTION_MODEL: "clustering",
            names.RECONSUME_TIMES: message.reconsume_times,
        }
        if message.message_id:
            attributes[names.MESSAGE_ID] = message.message_id
        if message.keys:
            attributes[names.ROCKETMQ_KEYS] = _keys(message.keys)
        if message.tags:
            attributes[names.ROCKETMQ_TAG] = message.tags
        if message.sharding_key is not None:
            attributes[names.ROCKETMQ_GROUP] = message.sharding_key
        if message.queue_id is not None:
            attributes["messaging.destination.partition.id"] = str(message.queue_id)
        span = o.tracer.start_span(
            f"process {message.topic}",
            context=parent,
            kind=o.CONSUMER,
            attributes=attributes,
            links=links,
        )
        errors: list[str] = []
        token = o.context.attach(o.trace.set_span_in_context(span))
        _errors.set(errors)
        return span, token, errors

    def _end(
        self, message: Message, span: Any, token: Any, errors: list[str], ok: bool, elapsed: float
    ) -> None:
        o = self._o
        _errors.set(None)
        o.context.detach(token)
        error = _failure(errors, ok)
        if not ok and span.is_recording():
            span.set_attribute(names.ERROR_TYPE, error or "_OTHER")
            span.set_status(o.Status(o.ERROR, "the message will be delivered again"))
            if self.orderly:
                pass  # handed again in place after a moment: the attempts are events already
            elif message.reconsume_times >= self.max_reconsume:
                span.add_event(
                    names.EVENT_DEAD_LETTER,
                    {names.DESTINATION: f"%DLQ%{self.group}", **_reconsumed(message)},
                )
            else:
                span.add_event(names.EVENT_RETRY, _reconsumed(message))
        self._figures(error, elapsed)
        span.end()


def _failure(errors: list[str], ok: bool) -> str | None:
    """A delivery's ``error.type``: None when it succeeded, else the last error recorded while
    the handler ran (``_OTHER`` when it failed without raising)."""
    return None if ok else (errors[-1] if errors else "_OTHER")


def _reconsumed(message: Message) -> dict[str, Any]:
    return {names.RECONSUME_TIMES: message.reconsume_times}


def processing(
    handler: Callable[[Message], bool],
    *,
    group: str,
    topic: str,
    max_reconsume: int,
    orderly: bool,
) -> Callable[[Message], bool]:
    """``handler`` with the delivery telemetry of consumer ``group`` (``handler`` itself when
    OpenTelemetry is not installed)."""
    o = otel()
    if o is None:
        return handler
    return Processing(
        handler, o, group=group, topic=topic, max_reconsume=max_reconsume, orderly=orderly
    )


# ---- inside a span ------------------------------------------------------------------------------
def record_exception(exc: BaseException, *, failed: bool = True) -> None:
    """Record ``exc`` on the current span (the send, check or process span it happened in);
    ``failed``: also mark the span's status as an error.  Never raises."""
    errors = _errors.get()
    if errors is not None:
        errors.append(error_type(exc))

    def record(o: Otel, span: Any) -> None:
        span.record_exception(exc)
        if failed:
            span.set_status(o.Status(o.ERROR, f"{error_type(exc)}: {exc}"))

    _on_current_span(record, "could not record an exception on the span")


def add_event(name: str, attributes: Mapping[str, Any], *, failed: str | None = None) -> None:
    """Add event ``name`` to the current span; ``failed``: also mark its status as an error with
    that description.  Never raises."""

    def add(o: Otel, span: Any) -> None:
        span.add_event(name, dict(attributes))
        if failed is not None:
            span.set_status(o.Status(o.ERROR, failed))

    _on_current_span(add, "could not add a span event")


def _on_current_span(act: Callable[[Otel, Any], None], failure: str) -> None:
    """``act(o, span)`` on the current span where it is recorded; nothing without OpenTelemetry.
    What the core calls from inside a span must never raise into it: an error is logged as
    ``failure``."""
    o = otel()
    if o is None:
        return
    try:
        span = o.trace.get_current_span()
        if span.is_recording():
            act(o, span)
    except Exception:  # telemetry must never raise into the core
        log.warning(failure, exc_info=True)


def discard_counted(group: str, outcome: str, amount: int = 1) -> None:
    """Count a discarded half message of ``group`` in ``txmsg.discards`` with
    what the rescuer did (:data:`txmsg.otel.names.DISCARD_OUTCOMES`); ``amount=0`` makes the
    series exist before the first discard, so a dashboard shows 0 rather than no data."""
    o = otel()
    if o is None:
        return
    try:
        attributes = {
            names.SYSTEM: names.ROCKETMQ,
            names.PRODUCER_GROUP: group,
            names.DISCARD_OUTCOME: outcome,
        }
        o.discards.add((group, outcome), attributes, amount)
    except Exception:  # telemetry must never change what the rescuer does
        log.warning("could not count a discarded half message", exc_info=True)
