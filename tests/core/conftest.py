"""Fixtures for the core's unit tests: an app on the backend test double, and its registry."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from txmsg_broker.testing import wait_until

from txmsg import ListenerRegistry, TxMsg, TxMsgConfig

from .doubles import DoubleBackend


@pytest.fixture
def backend() -> DoubleBackend:
    return DoubleBackend()


@pytest.fixture
def app(backend: DoubleBackend) -> Iterator[TxMsg]:
    application = TxMsg(TxMsgConfig(), backend=backend)
    yield application
    application.close(timeout=5)


@pytest.fixture
def registry(app: TxMsg) -> ListenerRegistry:
    """The app's own registry: what ``@app.transactional_listener`` writes into."""
    return app.registry


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every executor thread a test starts must be gone when it ends (shutdown works)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    wait_until(
        lambda: (
            not [
                t
                for t in threading.enumerate()
                if t.ident not in before and t.name.startswith(("txmsg", "pool"))
            ]
        ),
        timeout=10,
        message="executor threads to exit",
    )
