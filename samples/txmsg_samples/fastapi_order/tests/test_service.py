"""The FastAPI order sample for real: uvicorn on loopback, driven over HTTP with httpx, against
the embedded broker, on both backends (issue 27).

Creating and paying an order over HTTP sends a transactional message whose async record-backed
listener marks it PAID; the async idempotent loyalty service grants its points once.  Paying
again is refused (409) and sends nothing; an unknown order is 404.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from txmsg_broker.codec import GET_MAX_OFFSET, SUCCESS
from txmsg_broker.rawclient import call
from txmsg_broker.testing import create_topic, wait_until

from txmsg import TxMsg, TxMsgConfig
from txmsg.aio.sqla import create_async_engine, make_async_session_factory
from txmsg.sqla.models import metadata
from txmsg_samples.fastapi_order import loyalty, orders
from txmsg_samples.fastapi_order.models import Base, Points


def _config(backend: str, broker: Any, tmp: Path) -> TxMsgConfig:
    if backend == "rocketmq5":
        return TxMsgConfig(backend="rocketmq5", endpoints=broker.grpc_endpoint)
    return TxMsgConfig(
        backend="rocketmq",
        name_server=broker.namesrv_addr,
        client_log_dir=str(tmp / "client-logs"),
        instance_prefix="fastapi",
    )


class Server:
    """uvicorn serving ``api`` on a loopback port of its own, on a thread (its own loop)."""

    def __init__(self, api: FastAPI) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        config = uvicorn.Config(api, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, name="uvicorn"
        )

    def __enter__(self) -> Server:
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=60, message="uvicorn to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        self.socket.close()


@pytest.fixture(params=["rocketmq", "rocketmq5"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def database(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'services.db'}"

    async def create() -> None:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
            await conn.run_sync(metadata.create_all)
        await engine.dispose()

    asyncio.run(create())
    return url


def test_order_paid_over_http_earns_points_once(
    backend: str, txmsg_grpc_broker: Any, database: str, tmp_path: Path
) -> None:
    broker = txmsg_grpc_broker
    create_topic(broker.namesrv_addr, orders.TOPIC, message_type="TRANSACTION")
    config = _config(backend, broker, tmp_path)
    order_engine = create_async_engine(database)
    api, _ = orders.build(config, make_async_session_factory(order_engine))
    loyalty_engine = create_async_engine(database)
    points_sessions = make_async_session_factory(loyalty_engine)
    loyalty_app = loyalty.build(config, points_sessions)

    try:
        _pay_over_http(api, loyalty_app, points_sessions, broker.broker_addr)
    finally:
        # each engine's pooled aiosqlite connections (their loops are gone now): closed here, or
        # garbage collection warns about them during whatever test runs next
        for engine in (order_engine, loyalty_engine):
            asyncio.run(engine.dispose())


def _pay_over_http(
    api: FastAPI,
    loyalty_app: TxMsg,
    points_sessions: async_sessionmaker[AsyncSession],
    broker_addr: str,
) -> None:
    with loyalty_app, Server(api) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        created = http.post("/orders", json={"item": "tea", "amount_cents": 1250})
        assert created.status_code == 201
        order = created.json()
        assert order["status"] == "NEW"

        paid = http.post(f"/orders/{order['id']}/pay")
        assert paid.status_code == 200, paid.text
        assert paid.json()["status"] == "PAID"
        assert paid.json()["transaction_key"]
        assert http.get(f"/orders/{order['id']}").json()["status"] == "PAID"

        again = http.post(f"/orders/{order['id']}/pay")
        assert again.status_code == 409
        assert http.post("/orders/nope/pay").status_code == 404

        assert loyalty_app.bridge is not None  # async listeners: the loyalty app's own loop

        def points() -> list[tuple[str, int]]:
            async def read() -> list[tuple[str, int]]:
                async with points_sessions() as session:
                    rows = await session.execute(select(Points.order_id, Points.points))
                    return [(o, p) for o, p in rows.all()]

            future = asyncio.run_coroutine_threadsafe(read(), loyalty_app.bridge.loop)  # type: ignore[union-attr]
            return future.result(30)

        wait_until(lambda: points() == [(order["id"], 12)], timeout=120, message="points")
        # once: the broker stores one paid event (the refused second pay sent none), so no
        # second one can land later (what a 1 s sleep hoped to show)
        assert _stored(broker_addr, orders.TOPIC) == 1
        assert points() == [(order["id"], 12)]


def _stored(broker_addr: str, topic: str) -> int:
    """Messages the broker stores in ``topic``: its queues' max offsets (GET_MAX_OFFSET)."""
    total = 0
    for queue_id in range(4):
        answer = call(broker_addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})
        assert answer.code == SUCCESS, answer.remark
        total += int(answer.ext("offset"))
    return total
