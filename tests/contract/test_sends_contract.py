"""Issue 17: the plain-send and orderly-consumption contract, once per installed backend, with
plain ``def`` listeners and with ``async def`` ones (``listener_style``, issue 27).

Through the public API only (``app.add_producer``, ``app.producer(group).send*``,
``@app.message_listener(orderly=True)``).  Where backends differ the test reads the declared
:class:`~txmsg.backend.Capabilities`: ``oneway``/``batch`` emulated or native (the messages arrive
either way; a native batch lands in one queue), ``delivery_timestamps`` (``deliver_at`` honoured or
refused naming ``delay_level``), ``orderly_consumer`` (per-key order, or a strict expected failure).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_group, create_topic, unique, wait_until

from txmsg import InvalidMessageError, Message, TxMsg
from txmsg.backend import Capabilities
from txmsg.sqla import create_engine, create_tables, make_session_factory

from .conftest import needs


class Got:
    """A message listener recording each delivery with its arrival time (thread-safe)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.delay = delay
        self.items: list[tuple[float, Message]] = []
        self.active: dict[str, int] = {}
        self.overlap = False

    def __call__(self, message: Message) -> None:
        key = self._enter(message)
        try:
            if self.delay:
                time.sleep(self.delay)
        finally:
            self._leave(key)

    def _enter(self, message: Message) -> str:
        key = message.sharding_key or ""
        with self.lock:
            self.items.append((time.monotonic(), message))
            self.active[key] = self.active.get(key, 0) + 1
            self.overlap |= self.active[key] > 1
        return key

    def _leave(self, key: str) -> None:
        with self.lock:
            self.active[key] -= 1

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for _, m in self.items]

    def messages(self) -> list[Message]:
        with self.lock:
            return [m for _, m in self.items]


class AsyncGot(Got):
    """:class:`Got` as an ``async def`` listener (issue 27): its delay is awaited, so another
    message of the same key could run meanwhile if the consumer let it."""

    async def __call__(self, message: Message) -> None:  # type: ignore[override]
        key = self._enter(message)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self._leave(key)


def _got(style: str, delay: float = 0.0) -> Got:
    return AsyncGot(delay) if style == "async" else Got(delay)


def _plain_app(
    make_app: Callable[..., TxMsg], broker: Any, kind: str, style: str
) -> tuple[TxMsg, str, str, Got]:
    topic, group = unique(f"cs_{kind.lower()}"), unique("pg_cs")
    create_topic(broker.namesrv_addr, topic, message_type=kind)
    app, got = make_app(), _got(style)
    app.add_producer(group=group)
    app.add_message_listener(got, topic=topic, group=unique("cg_cs"))
    return app, topic, group, got


def test_plain_sends_of_every_kind_arrive(
    make_app: Callable[..., TxMsg], broker: Any, capabilities: Capabilities, listener_style: str
) -> None:
    """send, send_async and send_oneway arrive with their tags/keys/properties, whether the backend's
    one-way send is native or an async send whose answer is ignored (``Capabilities.oneway``)."""
    app, topic, group, got = _plain_app(make_app, broker, "NORMAL", listener_style)
    with app:
        producer = app.producer(group)
        sync = producer.send(topic, b"sync", tags="T", keys="k-sync k-two", properties={"p": 1})
        assert sync.send_status == "SEND_OK"
        assert sync.message_id
        assert sync.offset is not None
        futures = [
            producer.send_async(topic, f"async-{i}".encode(), keys=f"k-a{i}") for i in range(4)
        ]
        async_ids = {f.result(timeout=20).message_id for f in futures}
        producer.send_oneway(topic, b"oneway", keys="k-one")
        wait_until(lambda: len(got.bodies()) >= 6, timeout=30, message="6 plain deliveries")
    assert sorted(got.bodies()) == sorted(
        [b"sync", b"oneway", *(f"async-{i}".encode() for i in range(4))]
    )
    first = next(m for m in got.messages() if m.body == b"sync")
    assert (first.message_id, first.tags, first.keys, first.properties.get("p")) == (
        sync.message_id,
        "T",
        "k-sync k-two",
        "1",
    )
    assert first.sharding_key is None
    assert async_ids == {m.message_id for m in got.messages() if m.body.startswith(b"async-")}


def test_a_refused_oneway_send_tells_the_caller_nothing(
    make_app: Callable[..., TxMsg],
    broker: Any,
    capabilities: Capabilities,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What ``Capabilities.oneway`` promises about a send the broker refuses (a plain message to a
    TRANSACTION topic, refused by a broker that checks ``message.type``): ``send_oneway`` returns
    either way, nothing raised.  A real one-way send (True) gets no answer, so nothing is logged
    about it; the emulated one (False) sends asynchronously and logs the refusal at WARNING
    (docs/guide/sending.md, "Backend differences").  The producer works on afterwards."""
    caplog.set_level(logging.WARNING, logger="txmsg")
    tx_topic, plain_topic, group = unique("cs_ow_tx"), unique("cs_ow_plain"), unique("pg_cs")
    create_topic(broker.namesrv_addr, tx_topic, message_type="TRANSACTION")
    create_topic(broker.namesrv_addr, plain_topic, message_type="NORMAL")
    app = make_app()
    app.add_producer(group=group)
    with app:
        producer = app.producer(group)
        producer.send_oneway(tx_topic, b"refused", keys="k-refused")  # returns: nothing raised

        def refusals() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if "one-way send failed" in r.getMessage() and tx_topic in r.getMessage()
            ]

        if not capabilities.oneway:
            wait_until(refusals, timeout=30, message="the emulated one-way send's refusal logged")
        after = producer.send(plain_topic, b"after")  # answered after the one-way send's request
        assert after.send_status == "SEND_OK"
    if capabilities.oneway:
        assert refusals() == []  # no answer came: nothing to log
    else:
        assert len(refusals()) == 1, refusals()


def test_batch_arrives_native_in_one_queue_or_one_by_one(
    make_app: Callable[..., TxMsg], broker: Any, capabilities: Capabilities, listener_style: str
) -> None:
    app, topic, group, got = _plain_app(make_app, broker, "NORMAL", listener_style)
    with app:
        result = app.producer(group).send_batch(
            topic, [f"b{i}".encode() for i in range(5)], tags="B"
        )
        assert result.send_status == "SEND_OK"
        wait_until(lambda: len(got.bodies()) >= 5, timeout=30, message="5 batch deliveries")
    assert sorted(got.bodies()) == [f"b{i}".encode() for i in range(5)]
    assert {m.tags for m in got.messages()} == {"B"}
    if result.message_ids or not capabilities.batch:
        # one id per message; only a native batch may come back without them (librocketmq 2.1.0
        # does not report a batch's ids: docs/backend-design.md)
        assert {m.message_id for m in got.messages()} == set(result.message_ids)
        assert len(result.message_ids) == 5
    if capabilities.batch:  # one SEND_BATCH_MESSAGE request: one queue, consecutive offsets
        queues = {m.queue_id for m in got.messages()}
        assert len(queues) == 1
        assert None not in queues


def test_delay_level_arrives_and_deliver_at_per_capability(
    make_app: Callable[..., TxMsg], broker: Any, capabilities: Capabilities, listener_style: str
) -> None:
    """``delay_level`` works everywhere (delay levels or timestamps); ``deliver_at`` is honoured
    (never delivered before it) with ``delivery_timestamps``, else refused naming ``delay_level``."""
    app, topic, group, got = _plain_app(make_app, broker, "DELAY", listener_style)
    with app:
        producer = app.producer(group)
        producer.send(topic, b"level-1", delay_level=1)
        wait_until(
            lambda: b"level-1" in got.bodies(), timeout=30, message="the delay-level message"
        )
        due = time.time() + 1.0
        if capabilities.delivery_timestamps:
            producer.send(topic, b"at", deliver_at=due)
            wait_until(lambda: b"at" in got.bodies(), timeout=30, message="the deliver_at message")
            arrived = next(t for t, m in got.items if m.body == b"at")
            assert (
                time.time() - (time.monotonic() - arrived) >= due - 0.05
            )  # never before it is due
        else:
            with pytest.raises(InvalidMessageError, match="delay_level"):
                producer.send(topic, b"at", deliver_at=due)


def test_ordered_sends_consumed_in_order_per_key_with_several_threads(
    make_app: Callable[..., TxMsg],
    broker: Any,
    capabilities: Capabilities,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    listener_style: str,
) -> None:
    """Same key -> same queue; an orderly listener with 4 threads hands each key's messages in send
    order, never two of one key at once (``Capabilities.orderly_consumer``)."""
    needs(request, capabilities, "orderly_consumer")
    topic, group, cg = unique("cs_fifo"), unique("pg_cs_fifo"), unique("cg_cs_fifo")
    create_topic(broker.namesrv_addr, topic, queues=4, message_type="FIFO")
    create_group(
        broker.namesrv_addr, cg, orderly=True
    )  # RocketMQ 5: FIFO pop only for such a group
    engine = create_engine(f"sqlite:///{tmp_path / 'orderly.db'}")
    create_tables(engine)
    got = _got(listener_style, delay=0.01)
    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(
        got,
        topic=topic,
        group=cg,
        orderly=True,
        concurrency=4,
        session_factory=make_session_factory(engine),
    )
    keys = [f"order-{k}" for k in range(6)]
    try:
        with app:
            producer = app.producer(group)
            queues: dict[str, set[int | None]] = {}
            for i in range(8):
                for key in keys:
                    r = producer.send_orderly(topic, f"{key}:{i}".encode(), sharding_key=key)
                    queues.setdefault(key, set()).add(r.queue_id)
            wait_until(lambda: len(got.bodies()) >= 48, timeout=60, message="48 ordered deliveries")
    finally:
        engine.dispose()
    assert all(len(q) == 1 for q in queues.values())  # one key, one queue
    for key in keys:
        assert [m.body for m in got.messages() if m.sharding_key == key] == [
            f"{key}:{i}".encode() for i in range(8)
        ]
    assert not got.overlap
