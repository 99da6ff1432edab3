"""Dependency injection with ``injector``: services ask for producers, not for the app.

::

    class OrderService:
        @inject
        def __init__(self, producer: TransactionalProducer): ...        # default listener group

    FeeProducer = Annotated[TransactionalProducer, ProducerGroup("fee-tx")]  # a type alias
    NotifyProducer = Annotated[Producer, ProducerGroup("notify")]            # plain sends

    class FeeService:
        @inject
        def __init__(self, fees: FeeProducer, notify: NotifyProducer): ...  # specific groups

    injector = Injector([TxMsgModule(app)])
    app.listener_factory = injector.get     # optional: listeners built by the injector too
    app.start()

:class:`TxMsgModule` binds, for every listener group and every plain producer group
(``app.add_producer``) ``g`` of the app (and any extra ``groups``), four keys:
``Annotated[Producer, ProducerGroup(g)]`` (``app.producer(g)``; ``producer_for(g)`` is that key,
for ``injector.get(producer_for("fee-tx"))``) and ``Annotated[TransactionalProducer,
ProducerGroup(g)]`` (``app.transactional_producer(g)``: the same object, typed to send in
transactions); and their awaitable twins ``Annotated[AsyncProducer, ProducerGroup(g)]``
(``app.async_producer(g)``; ``async_producer_for(g)``) and ``Annotated[AsyncTransactionalProducer,
ProducerGroup(g)]`` (``app.async_transactional_producer(g)``), :mod:`txmsg.aio.producer`.
Unannotated, each type is its ``app`` method with no group (``Producer`` is ``app.producer()``,
``TransactionalProducer`` ``app.transactional_producer()``, and so on).  Type checkers accept
the aliases as types.

The groups bound are those the app has when the injector is built: declare listeners
(``@app.transactional_listener``), ``app.add_producer`` and ``app.include(registry)`` first.
Producers are looked up when injected, so the injector may be built before ``app.start()``;
resolve services after it (before, injection raises :class:`~txmsg.NotStartedError`; for a group
the app does not have, or a plain group under a ``TransactionalProducer`` key,
:class:`~txmsg.UnknownGroupError`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any

import injector

from txmsg.aio.producer import AsyncProducer, AsyncTransactionalProducer
from txmsg.app import TxMsg
from txmsg.config import TxMsgConfig
from txmsg.producer import Producer, TransactionalProducer


@dataclass(frozen=True)
class ProducerGroup:
    """``Annotated`` metadata naming a producer group."""

    group: str


_KINDS: tuple[tuple[type[Any], Callable[[TxMsg, str | None], Any]], ...] = (
    (Producer, lambda app, group: app.producer(group)),
    (TransactionalProducer, lambda app, group: app.transactional_producer(group)),
    (AsyncProducer, lambda app, group: app.async_producer(group)),
    (AsyncTransactionalProducer, lambda app, group: app.async_transactional_producer(group)),
)
"""The four types a producer is injected as, each with the app method that returns it (``None``
picks the group as the method does).  Listed once: every group gets the same four keys."""


def _key(kind: type[Any], group: str) -> Any:
    return Annotated[kind, ProducerGroup(group)]


def producer_for(group: str) -> Any:
    """The injection key (an ``Annotated`` type) of the producer of ``group``, typed for plain
    sends (``Annotated[TransactionalProducer, ProducerGroup(group)]`` is the transactional key)."""
    return _key(Producer, group)


def async_producer_for(group: str) -> Any:
    """The injection key of the awaitable producer of ``group``
    (``Annotated[AsyncProducer, ProducerGroup(group)]``, ``app.async_producer(group)``)."""
    return _key(AsyncProducer, group)


class TxMsgModule(injector.Module):
    """Binds the app, its config, its default producers and four keys per producer group (the
    plain type, the transactional one and their awaitable twins)."""

    def __init__(self, app: TxMsg, groups: Iterable[str] = ()) -> None:
        self.app = app
        self.groups = tuple(groups)

    def configure(self, binder: injector.Binder) -> None:
        app = self.app
        binder.bind(TxMsg, to=app)
        binder.bind(TxMsgConfig, to=app.config)
        for kind, get in _KINDS:
            binder.bind(kind, to=_provider(app, get, None))
        groups = set(app.registry.listeners) | set(app.registry.producer_groups) | set(self.groups)
        for group in sorted(groups):
            for kind, get in _KINDS:
                binder.bind(_key(kind, group), to=_provider(app, get, group))


def _provider(
    app: TxMsg, get: Callable[[TxMsg, str | None], Any], group: str | None
) -> injector.CallableProvider[Any]:
    """Looks the producer up when injected (not when bound): the app may not have started yet."""
    return injector.CallableProvider(lambda: get(app, group))
