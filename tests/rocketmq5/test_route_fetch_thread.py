"""The 5.x client fetches a topic's route in the caller's thread and, when the proxy has answered
before its callback is attached (a descheduled caller on a busy machine), handles the answer in
that thread too: a topic on new endpoints then opens the telemetry stream there, which needs the
thread's event loop.  A worker thread (``asyncio.to_thread``, txmsg's send pool) has none, and
neither has a thread whose ``asyncio.run()`` has returned; the route was lost and the send failed
with "failed to fetch topic route" (a CI flake of test_sync_after_asyncio_run).  The backend
fetches routes on a thread of its own that has the client's I/O loop as its event loop.

Here the race is forced: the route query's future is returned only once it is done."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from rocketmq.v5.client.connection.rpc_client import RpcClient
from txmsg_broker.testing import create_topic, unique, wait_until
from txmsg_rocketmq5.backend import RocketMQ5Backend

from txmsg.message import OutgoingMessage


@pytest.fixture
def backend(txmsg_grpc_broker: Any) -> Iterator[RocketMQ5Backend]:
    b = RocketMQ5Backend(SimpleNamespace(endpoints=txmsg_grpc_broker.grpc_endpoint))
    yield b
    b.close(timeout=20)


@pytest.fixture
def answered_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every route query of every 5.x client returns its future only once it is done."""
    query = RpcClient.query_topic_route_async

    def answered_first(self: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = query(self, *args, **kwargs)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        done.wait(30)
        return future

    monkeypatch.setattr(RpcClient, "query_topic_route_async", answered_first)


def _in_a_thread_without_a_loop(call: Any) -> Any:
    out: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(None)  # as asyncio.run() leaves its thread
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    worker = threading.Thread(target=run, name="no-loop")
    worker.start()
    worker.join(60)
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _exchange(backend: RocketMQ5Backend, broker: Any) -> None:
    """A consumer's start and a producer's first send on a new topic (both fetch its route), each
    in a thread without an event loop: the message is sent and received."""
    topic = unique("route_first")
    create_topic(broker.namesrv_addr, topic)
    seen: list[bytes] = []
    _in_a_thread_without_a_loop(
        lambda: backend.subscribe(
            topic, unique("cg_route_first"), lambda m: seen.append(m.body) or True
        )
    )
    sender = backend.create_sender(unique("pg_route_first"))
    result = _in_a_thread_without_a_loop(
        lambda: sender.send(OutgoingMessage(topic=topic, body=b"first"))
    )
    assert result.send_status == "SEND_OK"
    wait_until(lambda: seen == [b"first"], timeout=60)


def test_routes_answered_first_are_kept_in_threads_without_a_loop(
    backend: RocketMQ5Backend, txmsg_grpc_broker: Any, answered_first: None
) -> None:
    _exchange(backend, txmsg_grpc_broker)
    # a new event loop policy (uvloop.install(), a test resetting asyncio) knows no thread's loop,
    # the route threads' included: they set it for every fetch
    asyncio.set_event_loop_policy(None)
    _exchange(backend, txmsg_grpc_broker)
