"""txmsg: Spring-style RocketMQ transactional messages for Python services.

Declare a listener per producer group, start a :class:`TxMsg`, send with its producer::

    @transactional_listener(group="order-tx", topics=["orders"])
    class PayOrder:
        def execute_local(self, message, arg): ...
        def check_local(self, message): ...

    with TxMsg() as app:
        app.producer("order-tx").send_in_transaction("orders", {"id": 1}, arg=order)
"""

__all__ = [
    # states and messages
    "LocalTransactionState",
    "Message",
    "TransactionSendResult",
    # declaring listeners
    "transactional_listener",
    "message_listener",
    "ListenerSpec",
    "ConsumerSpec",
    "ListenerRegistry",
    "default_registry",
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
    "ConfigError",
    "RejectedError",
    "SendError",
    "BackendUnavailableError",
    "ProducerClosedError",
    "NotStartedError",
]

from txmsg.app import TxMsg
from txmsg.config import TxMsgConfig, load_config
from txmsg.consumer import ConsumerSpec, message_listener
from txmsg.convert import from_body, register_converter, to_body
from txmsg.di import ProducerGroup, TxMsgModule, producer_for
from txmsg.dispatch import CheckDispatcher
from txmsg.errors import (
    BackendUnavailableError,
    ConfigError,
    ListenerDefinitionError,
    NotStartedError,
    ProducerClosedError,
    RejectedError,
    SendError,
    TxMsgError,
)
from txmsg.executor import ExecutorConfig, ExecutorStats, RejectionPolicy, TxExecutor
from txmsg.listener import ListenerSpec, transactional_listener
from txmsg.message import Message, TransactionSendResult
from txmsg.producer import ProducerStats, TransactionalProducer
from txmsg.registry import ListenerRegistry, default_registry
from txmsg.states import LocalTransactionState
