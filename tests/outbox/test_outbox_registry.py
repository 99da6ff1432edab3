"""Issue 37 item 4: a module-level ``ListenerRegistry`` carries outboxes and their dead-row hooks
(as it carries ``on_parked`` hooks), and ``app.include(registry)`` takes them."""

from __future__ import annotations

import pytest

from conftest import Db
from txmsg import InvalidNameError, LifecycleError, ListenerRegistry, TxMsg, TxMsgConfig
from txmsg.errors import ListenerDefinitionError
from txmsg.sqla.outbox import OutboxDeadEvent

GROUP = "module-outbox"


def test_a_registry_declares_outboxes_and_the_app_includes_them(sqlite: Db) -> None:
    registry = ListenerRegistry()
    outbox = registry.add_outbox(group=GROUP, session_factory=sqlite.sessions)
    quiet = registry.add_outbox(group="writer-only", session_factory=sqlite.sessions, relay=False)
    dead: list[OutboxDeadEvent] = []
    assert registry.on_outbox_dead(dead.append) == dead.append
    assert registry.outboxes == {GROUP: outbox, "writer-only": quiet}
    assert registry.producer_groups == (GROUP,)  # the in-process relay's producer
    with pytest.raises(ListenerDefinitionError, match="already"):
        registry.add_outbox(group=GROUP, session_factory=sqlite.sessions)
    with pytest.raises(ListenerDefinitionError, match="OutboxDeadEvent"):
        registry.on_outbox_dead(42)  # type: ignore[type-var]

    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    app.include(registry)
    assert app.outboxes == {GROUP: outbox, "writer-only": quiet}
    assert app.outbox_dead_hooks == (dead.append,)
    assert GROUP in app.registry.producer_groups
    with pytest.raises(LifecycleError, match="included"):
        registry.add_outbox(group="late", session_factory=sqlite.sessions)

    again = ListenerRegistry()
    again.add_outbox(group=GROUP, session_factory=sqlite.sessions)
    with pytest.raises(ListenerDefinitionError, match=f"outbox group '{GROUP}'.*already declared"):
        app.include(again)
    assert not again.frozen  # nothing taken


def test_add_producer_takes_the_group_by_keyword_on_the_registry_as_on_the_app() -> None:
    registry = ListenerRegistry()
    registry.add_producer(group="notify")
    with pytest.raises(TypeError):
        registry.add_producer("notify")  # type: ignore[misc]
    with pytest.raises(InvalidNameError):
        registry.add_producer(group="no spaces")
    assert registry.producer_groups == ("notify",)
