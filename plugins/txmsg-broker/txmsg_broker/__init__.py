"""Embedded RocketMQ-compatible name server + broker that the real librocketmq client accepts.

Start it with ``txmsg broker``, ``EmbeddedBroker`` (in-process thread) or ``EmbeddedBroker.spawn``
(child process); tests use the ``txmsg_broker`` pytest fixture.
"""

from .app import BrokerProcess, EmbeddedBroker
from .config import BrokerConfig

__all__ = ["BrokerConfig", "BrokerProcess", "EmbeddedBroker"]
