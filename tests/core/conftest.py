"""Fixtures for the core's unit tests: a private registry and the backend test double."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

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
        what="executor threads to exit",
    )


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll ``condition`` (a generous wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)
