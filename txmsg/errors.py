"""One error tree for txmsg; every message says what to do next.

Catch :class:`TxMsgError` to catch anything txmsg raises on purpose.  Each error also derives from
the built-in exception a Python user would expect for its kind (``TypeError`` for a wrongly
declared listener, ``ValueError`` for a bad name or setting, ``LookupError`` for an unknown
group, ``RuntimeError`` for a call in the wrong state), so generic handlers keep working::

    TxMsgError
    ├── ListenerDefinitionError   (TypeError)     a listener or consumer declared wrongly
    ├── InvalidNameError          (ValueError)    a group or topic name RocketMQ or the backend refuses
    ├── InvalidMessageError       (TypeError, ValueError)  a payload, property or send option refused
    ├── ConfigError               (ValueError)    an unknown or invalid configuration key
    ├── LifecycleError            (RuntimeError)  a call in the wrong state of the app
    │   ├── NotStartedError                       used before start()
    │   └── ClosedError                           used after close()  (alias: ProducerClosedError)
    ├── UnknownGroupError         (LookupError)   no producer for that group
    ├── RejectedError             (RuntimeError)  the executor is saturated (rejection = abort)
    ├── SendError                 (RuntimeError)  the broker did not accept a message
    ├── BackendUnavailableError   (RuntimeError)  a backend cannot be found, loaded or started
    └── TransactionFencedError    (RuntimeError)  a local transaction lost the race to a check-back
"""

from __future__ import annotations


class TxMsgError(Exception):
    """Base class of every error txmsg raises on purpose."""


class ListenerDefinitionError(TxMsgError, TypeError):
    """A listener or consumer is declared wrongly (raised when it is declared, not at start)."""


class InvalidNameError(TxMsgError, ValueError):
    """A group or topic name that RocketMQ, or the configured backend, would refuse.

    Raised when a listener is registered (so the mistake shows at import time) and when a message
    is sent to a topic.  ``kind`` is ``producer_group``, ``consumer_group`` or ``topic``.
    """

    def __init__(self, message: str, *, kind: str, name: object) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name


class InvalidMessageError(TxMsgError, TypeError, ValueError):
    """A message txmsg will not send: a payload no converter handles, a reserved property name,
    an invalid send option.  Nothing was sent."""


class ConfigError(TxMsgError, ValueError):
    """A configuration key is unknown or its value is invalid.

    ``key`` is the dotted key (``producer.group``) or the environment variable that was wrong.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class LifecycleError(TxMsgError, RuntimeError):
    """The application (or one of its producers) was used in the wrong state.

    For example: a listener registered after ``start()``, or a registry included twice.
    """


class NotStartedError(LifecycleError):
    """The application was used before ``start()``."""


class ClosedError(LifecycleError):
    """The application or a producer was used after ``close()``."""


ProducerClosedError = ClosedError
"""The name producers' callers know; the same class as :class:`ClosedError`."""


class UnknownGroupError(TxMsgError, LookupError):
    """No producer (transactional listener) is registered for the group asked for."""

    def __init__(self, message: str, *, group: str | None) -> None:
        super().__init__(message)
        self.group = group


class RejectedError(TxMsgError, RuntimeError):
    """An executor could take no more work (all threads busy and queue full), or is shut down."""


class SendError(TxMsgError, RuntimeError):
    """The broker did not accept a message."""


class BackendUnavailableError(TxMsgError, RuntimeError):
    """A backend could not be found, loaded or started."""


class TransactionFencedError(TxMsgError, RuntimeError):
    """A check-back already settled this transaction (ROLLBACK after its in-flight timeout), so the
    local transaction must not commit.  Raised inside the local transaction, which rolls back."""


class SystemTopicUnavailableError(BackendUnavailableError):
    """The backend cannot consume a broker system topic (``TRANS_CHECK_MAX_TIME_TOPIC``, where
    the broker moves the half messages it gave up checking).  A RocketMQ 5 proxy refuses every
    system topic over gRPC; the message names the remoting route that reaches it instead."""
