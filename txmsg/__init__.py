"""txmsg: Spring-style RocketMQ transactional messages for Python services.

Declare a listener per producer group on an app, start it, send with its producer::

    app = TxMsg(load_config())

    @app.transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg): ...
        def check_local(self, message): ...

    with app:
        app.producer("order-tx").send_in_transaction("orders", {"id": 1}, arg=order)

Everything txmsg raises on purpose derives from :class:`TxMsgError` (see :mod:`txmsg.errors`).
"""

__all__ = [
    # states and messages
    "LocalTransactionState",
    "Message",
    "TransactionSendResult",
    # declaring listeners
    "ListenerRegistry",
    "ListenerSpec",
    "ConsumerSpec",
    # running
    "TxMsg",
    "TransactionalProducer",
    "ProducerStats",
    "CheckDispatcher",
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
]

from txmsg.app import TxMsg
from txmsg.config import TxMsgConfig, load_config
from txmsg.consumer import ConsumerSpec
from txmsg.convert import from_body, register_converter, to_body
from txmsg.di import ProducerGroup, TxMsgModule, producer_for
from txmsg.dispatch import CheckDispatcher
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
    TransactionFencedError,
    TxMsgError,
    UnknownGroupError,
)
from txmsg.executor import ExecutorConfig, ExecutorStats, RejectionPolicy, TxExecutor
from txmsg.listener import ListenerSpec
from txmsg.message import Message, TransactionSendResult
from txmsg.producer import ProducerStats, TransactionalProducer
from txmsg.registry import ListenerRegistry
from txmsg.states import LocalTransactionState
