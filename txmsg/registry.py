"""Where decorators record listeners and consumers until an application starts them.

Decorators only record (pluggy's "mark, then an explicit object collects"); nothing connects to
a broker at import time.  A registry is passed explicitly, or the process-wide
:data:`default_registry` is used (dramatiq's broker fallback).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from txmsg.errors import ListenerDefinitionError

if TYPE_CHECKING:
    from txmsg.consumer import ConsumerSpec
    from txmsg.listener import ListenerSpec


class ListenerRegistry:
    """Transactional listeners by producer group, and message consumers by consumer group."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: dict[str, ListenerSpec] = {}
        self._consumers: dict[str, ConsumerSpec] = {}

    def add_listener(self, spec: ListenerSpec) -> None:
        """Record ``spec``; one listener per producer group (RocketMQ routes a group's
        check-backs to whichever producer of the group it picks, so two listeners would each
        answer for the other's transactions)."""
        with self._lock:
            bound = self._listeners.get(spec.group)
            if bound is not None:
                raise ListenerDefinitionError(
                    f"producer group {spec.group!r} is already bound to {bound.name}; "
                    f"cannot also bind {spec.name}. RocketMQ allows one transaction listener per "
                    "producer group: give this listener its own group=..."
                )
            self._listeners[spec.group] = spec

    def add_consumer(self, spec: ConsumerSpec) -> None:
        """Record ``spec``; one subscription per consumer group (RocketMQ requires every
        consumer of a group to subscribe identically)."""
        with self._lock:
            bound = self._consumers.get(spec.group)
            if bound is not None:
                raise ListenerDefinitionError(
                    f"consumer group {spec.group!r} is already used by {bound.name} "
                    f"(topic {bound.topic!r}); cannot also use it for {spec.name}. "
                    "Give each message listener its own group=..."
                )
            self._consumers[spec.group] = spec

    def listener(self, group: str) -> ListenerSpec | None:
        with self._lock:
            return self._listeners.get(group)

    @property
    def listeners(self) -> dict[str, ListenerSpec]:
        """A copy: producer group -> spec."""
        with self._lock:
            return dict(self._listeners)

    @property
    def consumers(self) -> dict[str, ConsumerSpec]:
        """A copy: consumer group -> spec."""
        with self._lock:
            return dict(self._consumers)

    def clear(self) -> None:
        """Forget everything (tests)."""
        with self._lock:
            self._listeners.clear()
            self._consumers.clear()

    def __repr__(self) -> str:
        return f"<ListenerRegistry listeners={sorted(self._listeners)} consumers={sorted(self._consumers)}>"


default_registry = ListenerRegistry()
"""The registry decorators use when none is given."""
