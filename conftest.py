"""The whole suite (tests, samples, docs examples): the real client's logs go to a temp dir (not ``~/logs``), also in tests that use
librocketmq without a broker fixture (the txmsg_broker plugin sets it only for its own fixtures)."""

from __future__ import annotations

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if "ROCKETMQ_CLIENT_LOG_DIR" not in os.environ:
        os.environ["ROCKETMQ_CLIENT_LOG_DIR"] = tempfile.mkdtemp(prefix="rocketmq-client-logs-")
