"""Fixtures for the core's unit tests: a private registry and the backend test double."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from txmsg_broker.testing import wait_until

from txmsg import ListenerRegistry, TxMsg, TxMsgConfig

from .doubles import DoubleBackend


@pytest.fixture
def registry() -> ListenerRegistry:
    return ListenerRegistry()


@pytest.fixture
def backend() -> DoubleBackend:
    return DoubleBackend()


@pytest.fixture
def app(registry: ListenerRegistry, backend: DoubleBackend) -> Iterator[TxMsg]:
    application = TxMsg(TxMsgConfig(), registry=registry, backend=backend)
    yield application
    application.close(timeout=5)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every executor thread a test starts must be gone when it ends (shutdown works)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    wait_until(
        lambda: not [
            t for t in threading.enumerate()
            if t.ident not in before and t.name.startswith(("txmsg", "pool"))
        ],
        timeout=10,
        message="executor threads to exit",
    )
