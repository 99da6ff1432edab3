"""The core's error types, imported in one place for the plugin."""

from __future__ import annotations

from txmsg.errors import (
    BackendUnavailableError,
    InvalidMessageError,
    InvalidNameError,
    ProducerClosedError,
    SendError,
)

__all__ = [
    "BackendUnavailableError",
    "InvalidMessageError",
    "InvalidNameError",
    "ProducerClosedError",
    "SendError",
]
