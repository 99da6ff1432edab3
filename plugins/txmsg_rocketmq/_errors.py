"""The core's error types, imported in one place for the plugin."""

from __future__ import annotations

from txmsg.errors import BackendUnavailableError, ProducerClosedError, SendError

__all__ = ["BackendUnavailableError", "ProducerClosedError", "SendError"]
