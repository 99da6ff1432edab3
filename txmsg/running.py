"""What a started :class:`txmsg.TxMsg` runs: one producer per listener group and per plain
producer group, the consumers, the outbox relays and the rescue consumers.

:class:`Running` starts them in that order from the app's registry and stops them in two
stages: :meth:`Running.stop` (consumers, relays, rescuers: nothing new arrives) and
:meth:`Running.close` (producers, then the listener instances), so that the app can let the
awaited sends in flight finish between the two.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txmsg.aio.callables import is_async
from txmsg.aio.loop import LoopBridge
from txmsg.backend import Backend, capabilities_of
from txmsg.config import TxMsgConfig
from txmsg.consumer import ConsumerSpec
from txmsg.errors import ListenerDefinitionError, UnknownGroupError
from txmsg.listener import ListenerSpec, bind_spec
from txmsg.message import Message
from txmsg.names import NameRule
from txmsg.producer import Producer, TransactionalProducer
from txmsg.registry import ListenerRegistry

if TYPE_CHECKING:
    from txmsg.rescue import Rescuer

log = logging.getLogger("txmsg.app")


class Running:
    """The started parts of one app (see the module docstring).

    Parameters:
        config: the app's settings (per-group overrides, timeouts, the default group).
        registry: the app's declarations, frozen while this runs.
        backend: the loaded backend.
        name_rules: the backend's name rules, for every send's topic.
        bridge: the event loop ``async def`` listeners run on, if any.
        chosen: group -> the listener instance the user chose (``app.use_listener``).
        listener_factory: makes a listener instance of a declared class.
    """

    def __init__(
        self,
        config: TxMsgConfig,
        registry: ListenerRegistry,
        backend: Backend,
        *,
        name_rules: tuple[NameRule, ...],
        bridge: LoopBridge | None,
        chosen: dict[str, Any],
        listener_factory: Callable[[type[Any]], Any],
    ) -> None:
        self.config = config
        self.registry = registry
        self.backend = backend
        self.capabilities = capabilities_of(backend)
        self.name_rules = name_rules
        self.bridge = bridge
        self._chosen = chosen
        self._listener_factory = listener_factory
        self.producers: dict[str, Producer] = {}
        """Producer group -> producer (listener groups' are transactional)."""
        self.instances: dict[str, Any] = {}
        """Producer group -> the listener instance its producer uses."""
        self.rescuers: dict[str, Rescuer] = {}
        self.stops: list[Callable[[float], None]] = []
        """What :meth:`stop` calls (in reverse): consumers, relays, rescue consumers."""

    # ---- start ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start everything; on an error what started stays recorded here, for :meth:`stop`
        and :meth:`close`.

        Raises:
            ListenerDefinitionError: an ``orderly=True`` listener on a backend without orderly
                consumers, or a listener instance that cannot be made.
        """
        consumers = sorted(self.registry.consumers.items())
        self._refuse_orderly([cspec for _, cspec in consumers if cspec.orderly])
        self._start_producers()
        for group, cspec in consumers:
            self._subscribe(group, cspec)
        for group, outbox in sorted(self.registry.outboxes.items()):
            if outbox.relay_in_process:  # stopped with the consumers, before the producers
                outbox.start_relay(self.producers[group], hooks=self.registry.outbox_dead_hooks)
                self.stops.append(outbox.stop_relay)
        self._start_rescues()

    def _refuse_orderly(self, orderly: list[ConsumerSpec]) -> None:
        if orderly and not self.capabilities.orderly_consumer:
            backend = self.backend
            raise ListenerDefinitionError(
                f"{orderly[0].name} (group {orderly[0].group!r}) is orderly=True, but backend "
                f"{getattr(backend, 'name', backend)!r} has no orderly consumer; use a backend "
                "that has one (rocketmq, rocketmq5) or drop orderly=True"
            )

    def _start_producers(self) -> None:
        declared = self.registry.producer_groups
        for group, spec in sorted(self.registry.listeners.items()):
            listener = self._listener_for(spec)
            # The app's spec goes on the instance, never on its class (another app may declare
            # the class under another group): txmsg.sqla reads its group and exception state
            # there.  Raises if another app's group is bound to it already.
            bind_spec(listener, spec)
            self.instances[group] = listener
            settings = self.config.listener_settings(group)
            executor = settings.apply(spec.executor) if settings else spec.executor
            producer = TransactionalProducer.create(
                self.backend,
                spec,
                listener,
                executor,
                check_wait_timeout=self.config.check_wait_timeout,
                name_rules=self.name_rules,
                capabilities=self.capabilities,
                bridge=self.bridge,
            )
            self.producers[group] = producer
            if group in declared:  # also add_producer: its plain-send client starts now too
                producer.open_sender()
            log.info("producer group %s started (executor %s)", group, executor)
        for group in declared:
            if group not in self.producers:
                self.producers[group] = Producer.create_plain(
                    self.backend,
                    group,
                    name_rules=self.name_rules,
                    capabilities=self.capabilities,
                )
                log.info("producer group %s started (plain sends)", group)

    def _listener_for(self, spec: ListenerSpec) -> Any:
        if spec.group in self._chosen:
            return self._chosen[spec.group]
        if spec.is_instance:
            return spec.target
        try:
            return self._listener_factory(spec.target)
        except Exception as exc:
            raise ListenerDefinitionError(
                f"could not create listener {spec.name} for group {spec.group!r}: "
                f"{type(exc).__name__}: {exc}. Give it a no-argument constructor, pass "
                "listener_factory=..., or call app.use_listener(instance)"
            ) from exc

    def _subscribe(self, group: str, cspec: ConsumerSpec) -> None:
        override = self.config.consumer_settings(group)
        concurrency = (override.concurrency if override else None) or cspec.concurrency
        max_reconsume = cspec.max_reconsume
        if override is not None and override.max_reconsume is not None:
            max_reconsume = override.max_reconsume
        consume_from = (override.consume_from if override else None) or "first"
        # `orderly` only when asked: a backend written before orderly consumers existed still
        # takes every other listener (and the capability check refused orderly ones).
        extra: dict[str, Any] = {"orderly": True} if cspec.orderly else {}
        handler = cspec.safe_handler(
            on_parked=self.registry.parked_hooks,
            journal=cspec.orderly and not self.capabilities.orderly_crash_safe,
            bridge=self.bridge,
            max_reconsume=max_reconsume,
        )
        stop = self.backend.subscribe(
            cspec.topic,
            group,
            handler,
            tags=cspec.tags,
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            consume_from=consume_from,
            **extra,
        )
        self.stops.append(_then_close(stop, handler))
        log.info(
            "consumer group %s subscribed to %s%s",
            group,
            cspec.topic,
            " (orderly)" if cspec.orderly else "",
        )

    def _start_rescues(self) -> None:
        """A rescue consumer per transactional group (``rescue_discarded``, on by default):
        :mod:`txmsg.rescue`.  Stopped with the consumers, before the producers it sends with."""
        from txmsg.rescue import start_rescue  # noqa: PLC0415 - only for apps with listeners

        for group, spec in sorted(self.registry.listeners.items()):
            producer = self.producers[group]
            if not spec.rescue_discarded or not isinstance(producer, TransactionalProducer):
                continue
            rescue = start_rescue(
                self.backend,
                producer,
                self.instances[group],
                attempts=spec.rescue_attempts,
                hooks=self.registry.transaction_discarded_hooks,
            )
            if rescue is not None:
                self.rescuers[group] = rescue.rescuer
                self.stops.append(rescue.stop)

    # ---- lookups --------------------------------------------------------------------------------
    def producer(self, group: str | None) -> Producer:
        """``app.producer(group)``'s answer (see there)."""
        if group is None:
            group = self.config.producer.group
        producers = self.producers
        if group is None:
            if len(producers) == 1:
                return next(iter(producers.values()))
            raise UnknownGroupError(
                f"several producer groups exist ({', '.join(sorted(producers)) or 'none'}); "
                "say which: app.producer('group') or set producer.group in the config",
                group=None,
            )
        try:
            return producers[group]
        except KeyError:
            known = ", ".join(sorted(producers)) or "none"
            raise UnknownGroupError(
                f"no transactional listener for producer group {group!r} (registered: {known}), "
                f"nor a plain producer group of that name; declare one with "
                f"@app.transactional_listener(group={group!r}) to send in transactions, or "
                f"app.add_producer(group={group!r}) for plain sends only",
                group=group,
            ) from None

    def transactional_producer(self, group: str | None) -> TransactionalProducer:
        """``app.transactional_producer(group)``'s answer (see there)."""
        if group is None:
            group = self.config.producer.group
        if group is None:
            listeners = [p for p in self.producers.values() if isinstance(p, TransactionalProducer)]
            if len(listeners) == 1:
                return listeners[0]
            raise UnknownGroupError(
                f"{'several' if listeners else 'no'} transactional listener groups exist "
                f"({', '.join(sorted(p.group for p in listeners)) or 'none'}); say which: "
                "app.transactional_producer('group') or set producer.group in the config",
                group=None,
            )
        producer = self.producer(group)
        if not isinstance(producer, TransactionalProducer):
            raise UnknownGroupError(
                f"producer group {group!r} is a plain producer group (app.add_producer): it has "
                "no transactional listener, so it cannot send in a transaction; declare one with "
                f"@app.transactional_listener(group={group!r}), or use app.producer({group!r}) "
                "for plain sends",
                group=group,
            )
        return producer

    # ---- stop -----------------------------------------------------------------------------------
    def stop(self, timeout: float) -> None:
        """Stop the consumers, relays and rescue consumers, in parallel (so ``timeout`` bounds
        the stage instead of adding up per group: a long-polling consumer may take its poll to
        notice).  Never raises."""
        in_parallel("stop a consumer", [(stop, timeout) for stop in reversed(self.stops)])
        self.stops.clear()

    def close(self, timeout: float) -> None:
        """Close the producers in parallel, then every listener instance with a ``close()``
        (after its producer: no check-back runs when it goes).  Never raises."""
        in_parallel(
            "close a producer", [(producer.close, timeout) for producer in self.producers.values()]
        )
        for group, listener in self.instances.items():
            close = getattr(listener, "close", None)
            if callable(close):
                quietly(f"close the listener of {group}", close)


def needs_loop(registry: ListenerRegistry, chosen: dict[str, Any]) -> bool:
    """Whether a declared listener (or the instance ``chosen`` for its group), handler or hook
    is ``async def``."""
    for spec in registry.listeners.values():
        target = chosen.get(spec.group, spec.target)
        if is_async(getattr(target, "execute_local", None)) or is_async(
            getattr(target, "check_local", None)
        ):
            return True
    if any(is_async(c.handler) for c in registry.consumers.values()):
        return True
    return any(is_async(hook) for hook in registry.parked_hooks)


def _then_close(
    stop: Callable[[float], None], handler: Callable[[Message], bool]
) -> Callable[[float], None]:
    """``stop``, then the handler's ``close`` if it has one (an orderly handler's journal sweeper
    must not outlive its consumer)."""
    close = getattr(handler, "close", None)
    if not callable(close):
        return stop

    def stop_then_close(timeout: float) -> None:
        try:
            stop(timeout)
        finally:
            close(timeout)

    return stop_then_close


def in_parallel(what: str, calls: list[tuple[Callable[[float], None], float]]) -> None:
    """Run each ``fn(timeout)`` on its own thread and wait for all of them; never raises."""
    if len(calls) <= 1:
        for fn, timeout in calls:
            quietly(what, fn, timeout)
        return
    threads = [
        threading.Thread(target=quietly, args=(what, fn, timeout), name=f"txmsg-close-{n}")
        for n, (fn, timeout) in enumerate(calls)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def quietly(what: str, fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``; an exception is logged ("could not {what} during shutdown")."""
    try:
        fn(*args)
    except Exception:
        log.exception("could not %s during shutdown", what)
