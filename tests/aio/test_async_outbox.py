"""Issue 27: the transactional outbox written from ``AsyncSession`` code (``outbox_send``), both
backends: a committed row is relayed and consumed; a rolled-back one never leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txmsg_broker.testing import create_topic, unique

from tests.clockwork import stored
from txmsg import Message, TxMsg
from txmsg.aio.sqla import create_async_engine, make_async_session_factory, outbox_send
from txmsg.sqla import create_engine, create_tables, make_session_factory


def test_outbox_send_commits_with_the_async_transaction(
    make_app: Callable[..., TxMsg], broker: Any, tmp_path: Path
) -> None:
    topic = unique("aio_outbox")
    create_topic(broker.namesrv_addr, topic, message_type="NORMAL")
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    sync_engine = create_engine(url)
    create_tables(sync_engine)
    engine = create_async_engine(url)
    sessions = make_async_session_factory(engine)
    got: list[bytes] = []

    async def consume(message: Message) -> None:
        got.append(message.body)

    app = make_app()
    outbox = app.add_outbox(
        group=unique("pg_outbox"),
        session_factory=make_session_factory(sync_engine),
        poll_interval=0.2,
    )
    app.add_message_listener(consume, topic=topic, group=unique("cg_outbox"))

    async def main() -> None:
        async with app:
            async with sessions() as session, session.begin():
                receipt = await outbox_send(outbox, session, topic, "kept", keys="k1")
                assert receipt.message_key
            try:
                async with sessions() as session, session.begin():
                    await outbox_send(outbox, session, topic, "rolled back")
                    raise RuntimeError("the business change failed")
            except RuntimeError:
                pass
            while not got:
                await asyncio.sleep(0.05)
            # a rolled-back row, had it been written, would follow (an event, not a 1 s sleep):
            # the relay polls twice more, nothing unsent; the topic's store is read below
            relay = outbox.stats().relay
            assert relay is not None
            while not _idle_since(outbox, relay.cycles + 2):
                await asyncio.sleep(0.05)
        await engine.dispose()

    try:
        asyncio.run(asyncio.wait_for(main(), 240))
    finally:
        sync_engine.dispose()
    assert got == [b"kept"]
    assert stored(broker.broker_addr, topic) == 1  # the relay sent nothing else


def _idle_since(outbox: Any, cycles: int) -> bool:
    """The outbox's relay has run ``cycles`` poll cycles and leaves nothing unsent."""
    stats = outbox.stats()
    return stats.relay is not None and stats.relay.cycles >= cycles and stats.unsent == 0
