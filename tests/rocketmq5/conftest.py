"""Fixtures for the rocketmq5 backend: apps on the embedded broker's gRPC endpoint.

Deliveries are observed by a remoting consumer (librocketmq, ``txmsg_broker.testing.Clients``) on the
same broker while the rocketmq5 backend has no consumers; the test that proves the backend needs no
librocketmq runs in a child interpreter where that client cannot be imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from txmsg import ListenerRegistry, TxMsg
from txmsg.config import TxMsgConfig

# tests/crash_kit.py (shared by test_fifo_crash and tests/rocketmq/test_orderly_crash): this folder
# is no package, so its modules import helpers by basename; tests/ goes on the path for that one.
_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.append(_TESTS)


@pytest.fixture
def make_app(txmsg_grpc_broker: Any) -> Iterator[Callable[..., TxMsg]]:
    """``make_app(registry, **config)``: a TxMsg on backend rocketmq5 at the fixture's endpoint."""
    apps: list[TxMsg] = []

    def make(registry: ListenerRegistry | None = None, **config: Any) -> TxMsg:
        settings = {"backend": "rocketmq5", "endpoints": txmsg_grpc_broker.grpc_endpoint, **config}
        app = TxMsg(TxMsgConfig(**settings))
        if registry is not None:
            app.include(registry)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.close(timeout=20)
