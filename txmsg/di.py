"""Dependency injection with ``injector``: services ask for producers, not for the app.

::

    class OrderService:
        @inject
        def __init__(self, producer: Producer): ...                     # default group

    FeeProducer = Annotated[Producer, ProducerGroup("fee-tx")]      # a type alias

    class FeeService:
        @inject
        def __init__(self, producer: FeeProducer): ...                  # a specific group

    injector = Injector([TxMsgModule(app)])
    app.listener_factory = injector.get     # optional: listeners built by the injector too
    app.start()

:class:`TxMsgModule` binds ``Annotated[Producer, ProducerGroup(g)]`` for every listener group and
every plain producer group (``app.add_producer``) ``g`` of the app (and any extra ``groups``);
``producer_for(g)`` is that key, for
``injector.get(producer_for("fee-tx"))``.  Type checkers accept the alias as a type.
``TransactionalProducer`` is the same class as ``Producer``, so keys written with either name are
one key.  The groups bound are those the app has when the injector is built: declare listeners
(``@app.transactional_listener``), ``app.add_producer`` and ``app.include(registry)`` first.
Producers are looked up when injected, so the injector may be built before ``app.start()``;
resolve services after it (before, injection raises :class:`~txmsg.NotStartedError`; for a group
the app does not have, :class:`~txmsg.UnknownGroupError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import injector

from txmsg.app import TxMsg
from txmsg.config import TxMsgConfig
from txmsg.producer import Producer


@dataclass(frozen=True)
class ProducerGroup:
    """``Annotated`` metadata naming a producer group."""

    group: str


def producer_for(group: str) -> Any:
    """The injection key (an ``Annotated`` type) of the producer of ``group``."""
    return Annotated[Producer, ProducerGroup(group)]


class TxMsgModule(injector.Module):
    """Binds the app, its config, its default producer and one key per producer group."""

    def __init__(self, app: TxMsg, groups: Iterable[str] = ()) -> None:
        self.app = app
        self.groups = tuple(groups)

    def configure(self, binder: injector.Binder) -> None:
        app = self.app
        binder.bind(TxMsg, to=app)
        binder.bind(TxMsgConfig, to=app.config)
        binder.bind(Producer, to=injector.CallableProvider(lambda: app.producer()))
        groups = set(app.registry.listeners) | set(app.registry.producer_groups) | set(self.groups)
        for group in sorted(groups):
            binder.bind(producer_for(group), to=_group_provider(app, group))


def _group_provider(app: TxMsg, group: str) -> injector.CallableProvider[Producer]:
    return injector.CallableProvider(lambda: app.producer(group))
