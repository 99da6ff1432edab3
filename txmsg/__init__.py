"""txmsg: Spring-style RocketMQ transactional messages for Python services.

Declare a listener per producer group on an app (or ``app.add_producer(group=...)`` for plain,
delayed and ordered sends only), start it, send with its producer::

    app = TxMsg(load_config())

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg): ...
        def check_local(self, message): ...

    with app:
        app.transactional_producer("order-tx").send_in_transaction("orders", {"id": 1}, arg=order)

``app.producer(group)`` is every group's :class:`Producer` (plain sends); a transactional
listener's group has a :class:`TransactionalProducer`, which adds ``send_in_transaction``.

Everything txmsg raises on purpose derives from :class:`TxMsgError` (see :mod:`txmsg.errors`).
"""

__all__ = [
    "defaults",
    "errors",
    # states and messages
    "LocalTransactionState",
    "Message",
    "TransactionSendResult",
    "SendResult",
    # declaring listeners
    "ListenerRegistry",
    "ListenerSpec",
    "ConsumerSpec",
    "ParkedEvent",
    "DiscardedEvent",
    # running
    "TxMsg",
    "Producer",
    "TransactionalProducer",
    "ProducerStats",
    "CheckDispatcher",
    # asyncio
    "AsyncProducer",
    "AsyncTransactionalProducer",
    "LoopBridge",
    "LoopBlockingWarning",
    # executor
    "ExecutorConfig",
    "RejectionPolicy",
    "TxExecutor",
    "ExecutorStats",
    # payloads
    "register_converter",
    "to_body",
    "from_body",
    # configuration and DI
    "TxMsgConfig",
    "load_config",
    "TxMsgModule",
    "ProducerGroup",
    "producer_for",
    # errors
    "TxMsgError",
    "ListenerDefinitionError",
    "InvalidNameError",
    "InvalidMessageError",
    "ConfigError",
    "LifecycleError",
    "NotStartedError",
    "ClosedError",
    "ProducerClosedError",
    "UnknownGroupError",
    "RejectedError",
    "SendError",
    "BackendUnavailableError",
    "TransactionFencedError",
    "SystemTopicUnavailableError",
]

from typing import TYPE_CHECKING, Any

from txmsg import defaults as defaults
from txmsg import errors as errors
from txmsg.errors import (
    BackendUnavailableError,
    ClosedError,
    ConfigError,
    InvalidMessageError,
    InvalidNameError,
    LifecycleError,
    ListenerDefinitionError,
    NotStartedError,
    ProducerClosedError,
    RejectedError,
    SendError,
    SystemTopicUnavailableError,
    TransactionFencedError,
    TxMsgError,
    UnknownGroupError,
)
from txmsg.states import LocalTransactionState

if TYPE_CHECKING:  # what `from txmsg import X` gives, for type checkers and IDEs
    from txmsg.aio.loop import LoopBlockingWarning, LoopBridge
    from txmsg.aio.producer import AsyncProducer, AsyncTransactionalProducer
    from txmsg.app import TxMsg
    from txmsg.config import TxMsgConfig, load_config
    from txmsg.consumer import ConsumerSpec
    from txmsg.convert import from_body, register_converter, to_body
    from txmsg.di import ProducerGroup, TxMsgModule, producer_for
    from txmsg.dispatch import CheckDispatcher
    from txmsg.executor import ExecutorConfig, ExecutorStats, RejectionPolicy, TxExecutor
    from txmsg.listener import ListenerSpec
    from txmsg.message import Message, SendResult, TransactionSendResult
    from txmsg.orderly import ParkedEvent
    from txmsg.producer import Producer, ProducerStats, TransactionalProducer
    from txmsg.registry import ListenerRegistry
    from txmsg.rescue import DiscardedEvent

_LAZY: dict[str, str] = {
    "AsyncProducer": "txmsg.aio.producer",
    "AsyncTransactionalProducer": "txmsg.aio.producer",
    "LoopBlockingWarning": "txmsg.aio.loop",
    "LoopBridge": "txmsg.aio.loop",
    "CheckDispatcher": "txmsg.dispatch",
    "ConsumerSpec": "txmsg.consumer",
    "DiscardedEvent": "txmsg.rescue",
    "ExecutorConfig": "txmsg.executor",
    "ExecutorStats": "txmsg.executor",
    "ListenerRegistry": "txmsg.registry",
    "ListenerSpec": "txmsg.listener",
    "Message": "txmsg.message",
    "ParkedEvent": "txmsg.orderly",
    "Producer": "txmsg.producer",
    "ProducerGroup": "txmsg.di",
    "ProducerStats": "txmsg.producer",
    "RejectionPolicy": "txmsg.executor",
    "SendResult": "txmsg.message",
    "TransactionSendResult": "txmsg.message",
    "TransactionalProducer": "txmsg.producer",
    "TxExecutor": "txmsg.executor",
    "TxMsg": "txmsg.app",
    "TxMsgConfig": "txmsg.config",
    "TxMsgModule": "txmsg.di",
    "from_body": "txmsg.convert",
    "load_config": "txmsg.config",
    "producer_for": "txmsg.di",
    "register_converter": "txmsg.convert",
    "to_body": "txmsg.convert",
}
"""Public names loaded on first use: ``import txmsg`` stays cheap (no pydantic, SQLAlchemy or
injector until a name that needs them is touched; measured by ``benchmarks/import_time.py``)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'txmsg' has no attribute {name!r}")
    import importlib  # noqa: PLC0415 - only when a lazy name is first used

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
