"""Dependency injection with ``injector``: services ask for producers, not for the app.

::

    class OrderService:
        @inject
        def __init__(self, producer: TransactionalProducer): ...        # default group

    FeeProducer = Annotated[TransactionalProducer, ProducerGroup("fee-tx")]   # a type alias

    class FeeService:
        @inject
        def __init__(self, producer: FeeProducer): ...                  # a specific group

    injector = Injector([TxMsgModule(app)])
    app.listener_factory = injector.get     # optional: listeners built by the injector too
    app.start()

:class:`TxMsgModule` binds ``Annotated[TransactionalProducer, ProducerGroup(g)]`` for every
listener group ``g`` of the app (and any extra ``groups``); ``producer_for(g)`` is that key, for
``injector.get(producer_for("fee-tx"))``.  Type checkers accept the alias as a type.
The groups bound are those the app has when the injector is built: declare listeners
(``@app.transactional_listener``) and ``app.include(registry)`` first.
Producers are looked up when injected, so the injector may be built before ``app.start()``;
resolve services after it (before, injection raises :class:`~txmsg.NotStartedError`; for a group
without a listener, :class:`~txmsg.UnknownGroupError`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import injector

from txmsg.app import TxMsg
from txmsg.config import TxMsgConfig
from txmsg.producer import TransactionalProducer


@dataclass(frozen=True)
class ProducerGroup:
    """``Annotated`` metadata naming a producer group."""

    group: str


def producer_for(group: str) -> Any:
    """The injection key (an ``Annotated`` type) of the producer of ``group``."""
    return Annotated[TransactionalProducer, ProducerGroup(group)]


class TxMsgModule(injector.Module):
    """Binds the app, its config, its default producer and one key per producer group."""

    def __init__(self, app: TxMsg, groups: Iterable[str] = ()) -> None:
        self.app = app
        self.groups = tuple(groups)

    def configure(self, binder: injector.Binder) -> None:
        app = self.app
        binder.bind(TxMsg, to=app)
        binder.bind(TxMsgConfig, to=app.config)
        binder.bind(
            TransactionalProducer,
            to=injector.CallableProvider(lambda: app.producer()),
        )
        for group in sorted(set(app.registry.listeners) | set(self.groups)):
            binder.bind(producer_for(group), to=_group_provider(app, group))


def _group_provider(app: TxMsg, group: str) -> injector.CallableProvider[TransactionalProducer]:
    return injector.CallableProvider(lambda: app.producer(group))
