"""A plain rocketmq5 app in a thread where ``asyncio.run()`` has returned (a script that ran an
async part first, a worker that served an async test): the 5.x client creates its gRPC channels
with its own I/O loop set as the thread's loop, so routes are fetched and messages flow."""

from __future__ import annotations

import asyncio
from typing import Any

from txmsg_broker.testing import create_topic, unique, wait_until

from txmsg import TxMsg, TxMsgConfig


def test_a_sync_rocketmq5_app_works_after_asyncio_run(broker: Any) -> None:
    topic = unique("aio_after_run")
    create_topic(broker.namesrv_addr, topic)
    got: list[str] = []

    def make() -> TxMsg:
        app = TxMsg(TxMsgConfig(backend="rocketmq5", endpoints=broker.grpc_endpoint))
        app.add_producer(group=unique("pg_after_run"))
        app.add_message_listener(
            lambda m: got.append(m.text()), topic=topic, group=unique("cg_after_run")
        )
        return app

    with make() as app:  # a client (and its I/O loop) exists before the asyncio.run
        app.producer().send(topic, "before")
        wait_until(lambda: "before" in got, timeout=60)

    async def serve() -> None:
        async with make() as app:
            await app.async_producer().send(topic, "async")
            while "async" not in got:
                await asyncio.sleep(0.05)

    asyncio.run(asyncio.wait_for(serve(), 120))
    with make() as app:
        app.producer().send(topic, "after")
        wait_until(lambda: "after" in got, timeout=60)
    assert got.count("after") == 1
