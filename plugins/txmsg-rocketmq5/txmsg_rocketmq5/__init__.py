"""txmsg backend ``rocketmq5``: the official RocketMQ 5 Python client (``rocketmq-python-client``).

Pure Python over gRPC: it runs wherever grpcio has wheels (Linux x86-64/arm64, macOS, Windows),
without librocketmq or ``rocketmq-client-python``.  Nothing in this package imports
``txmsg_rocketmq``, ``rocketmq.client`` or ``rocketmq.ffi`` (tests/rocketmq5 prove it).

Importing this package is cheap; the client is imported by :mod:`.backend` when the app starts.
"""

from __future__ import annotations

__all__: list[str] = []
