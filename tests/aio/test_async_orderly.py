"""Issue 27: an ``async def`` orderly listener and an ``async def`` on_parked hook, both backends.

A key whose message keeps failing is parked (the async hook is told), other keys flow on, and
``txmsg.sqla.parking.replay`` hands the parked messages to the async listener again once fixed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmsg_broker.testing import create_group, create_topic, unique, wait_until

from txmsg import Message, ParkedEvent, TxMsg
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.parking import parked_keys, replay


def test_async_orderly_listener_parks_and_replays(
    make_app: Callable[..., TxMsg], broker: Any, tmp_path: Path
) -> None:
    topic, group, cg = unique("aio_fifo"), unique("pg_fifo"), unique("cg_fifo")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="FIFO")
    create_group(broker.namesrv_addr, cg, orderly=True)
    engine = create_engine(f"sqlite:///{tmp_path / 'orderly.db'}")
    create_tables(engine)
    sessions = make_session_factory(engine)
    broken = threading.Event()
    broken.set()
    handled: list[str] = []
    parked: list[ParkedEvent] = []

    async def settle(message: Message) -> None:
        await asyncio.sleep(0)
        if message.sharding_key == "poison" and broken.is_set():
            raise RuntimeError("the refund service is down")
        handled.append(message.text())

    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(
        settle,
        topic=topic,
        group=cg,
        orderly=True,
        session_factory=sessions,
        max_orderly_retries=2,
        orderly_retry_delay=0.05,
    )

    @app.on_parked
    async def page(event: ParkedEvent) -> None:
        await asyncio.sleep(0)
        parked.append(event)

    try:
        with app:
            producer = app.producer(group)
            producer.send_orderly(topic, "poison:1", sharding_key="poison")
            producer.send_orderly(topic, "poison:2", sharding_key="poison")
            for i in range(3):
                producer.send_orderly(topic, f"fine:{i}", sharding_key="fine")
            wait_until(lambda: len(handled) == 3 and len(parked) == 1, timeout=120)
            wait_until(
                lambda: [k.messages for k in parked_keys(sessions, cg)] == [2],
                timeout=120,
                message="poison:2 parked behind its key",
            )
        assert handled == ["fine:0", "fine:1", "fine:2"]
        assert parked[0].sharding_key == "poison"
        assert "refund service is down" in parked[0].error
        broken.clear()  # fixed: replay hands both, in order, to the async listener
        spec = app.registry.consumers[cg]
        report = replay(spec, sessions, cg)
        assert report.ok
        assert report.replayed == 2
        assert handled[3:] == ["poison:1", "poison:2"]
        assert parked_keys(sessions, cg) == []
    finally:
        engine.dispose()
