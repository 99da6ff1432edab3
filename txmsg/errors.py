"""One error tree for txmsg; every message says what to do next.

Catch :class:`TxMsgError` to catch anything txmsg raises on purpose.
"""

from __future__ import annotations


class TxMsgError(Exception):
    """Base class of every error txmsg raises on purpose."""


class ListenerDefinitionError(TxMsgError, TypeError):
    """A listener or consumer is declared wrongly (raised at decoration time)."""


class ConfigError(TxMsgError, ValueError):
    """A configuration key is unknown or its value is invalid.

    ``key`` is the dotted key (``producer.group``) or the environment variable that was wrong.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class RejectedError(TxMsgError, RuntimeError):
    """An executor could take no more work (max threads busy and queue full), or is shut down."""


class SendError(TxMsgError, RuntimeError):
    """The broker did not accept a message."""


class BackendUnavailableError(TxMsgError, RuntimeError):
    """A backend could not be found or loaded."""


class ProducerClosedError(TxMsgError, RuntimeError):
    """A producer (or the application) was used after ``close()``."""


class NotStartedError(TxMsgError, RuntimeError):
    """The application was used before ``start()``."""
