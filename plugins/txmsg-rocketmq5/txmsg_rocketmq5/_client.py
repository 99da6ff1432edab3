"""The 5.x client names txmsg_rocketmq5 uses, imported through :func:`.package.ensure_client_package`.

Every module of this package imports the client from here, never ``rocketmq`` directly, so the
client imports whichever ``rocketmq/__init__.py`` pip wrote last (see :mod:`.package`).
"""

from __future__ import annotations

from .package import ensure_client_package

ensure_client_package()

# the package is ready: these imports see the 5.x client's names
from rocketmq import (  # noqa: E402
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import (  # noqa: E402
    AckMessageEntry,
    AckMessageRequest,
    Code,
    EndTransactionRequest,
    ForwardMessageToDeadLetterQueueRequest,
    TransactionSource,
)
from rocketmq.v5.exception import IllegalArgumentException, IllegalStateException  # noqa: E402

__all__ = [
    "AckMessageEntry",
    "AckMessageRequest",
    "ClientConfiguration",
    "Code",
    "Credentials",
    "EndTransactionRequest",
    "FilterExpression",
    "ForwardMessageToDeadLetterQueueRequest",
    "IllegalArgumentException",
    "IllegalStateException",
    "Message",
    "Producer",
    "SimpleConsumer",
    "TransactionChecker",
    "TransactionResolution",
    "TransactionSource",
]
