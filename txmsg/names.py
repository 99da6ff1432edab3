"""Group and topic names: RocketMQ's rule, plus whatever the configured backend adds.

RocketMQ's own rule (``Validators`` in the Java client) is 1-255 characters from letters, digits,
``-``, ``_``, ``%`` and ``|``.  A backend may refuse more: librocketmq 2.1.0, for instance, crashes
on consumer groups whose retry topic ``%RETRY%<group>`` contains a printf conversion such as
``%s``.  Such rules are contributed through the entry-point group ``txmsg.name_rules`` (one per
backend name, in a module that imports no native library), so the app checks names when a
listener is *registered* and when a message is *sent*, not when the client finally crashes.

A rule is a callable ``rule(kind, name) -> str | None``: ``kind`` is one of :data:`NAME_KINDS`,
the result is None when the name is fine, else why it is not (the app adds what to do).
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from collections.abc import Callable
from typing import Final, Literal

from txmsg.errors import InvalidNameError

log = logging.getLogger("txmsg.names")

NameKind = Literal["producer_group", "consumer_group", "topic"]
NAME_KINDS: Final[tuple[NameKind, ...]] = ("producer_group", "consumer_group", "topic")
NameRule = Callable[[NameKind, str], "str | None"]

NAME_RULES_GROUP: Final = "txmsg.name_rules"
NAME_PATTERN: Final = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
"""RocketMQ's rule for group and topic names (``Validators`` in the Java client)."""

_LABEL = {"producer_group": "group", "consumer_group": "group", "topic": "topic"}


def rocketmq_rule(kind: NameKind, name: str) -> str | None:
    """RocketMQ's own rule, shared by every backend."""
    if NAME_PATTERN.match(name):
        return None
    return (
        "RocketMQ names are 1-255 characters from letters, digits, '-', '_', '%' and '|' "
        f'(e.g. {_LABEL[kind]}="order-tx")'
    )


def rules_for_backend(backend: object) -> tuple[NameRule, ...]:
    """RocketMQ's rule plus the rules of ``backend`` (a backend name, or a backend object with a
    ``name_rule`` attribute).  A backend without rules only gets RocketMQ's."""
    rules: list[NameRule] = [rocketmq_rule]
    extra: object = None
    if isinstance(backend, str):
        if ":" not in backend:
            found = [
                ep
                for ep in importlib.metadata.entry_points(group=NAME_RULES_GROUP)
                if ep.name == backend
            ]
            if found:
                try:
                    extra = found[0].load()
                except Exception as exc:  # noqa: BLE001 - a broken plugin must not hide RocketMQ's rule
                    log.warning("name rules of backend %r failed to load: %s", backend, exc)
    elif backend is not None:
        extra = getattr(backend, "name_rule", None)
    if callable(extra):
        rules.append(extra)
    return tuple(rules)


def check_name(
    kind: NameKind,
    name: object,
    *,
    owner: str,
    rules: tuple[NameRule, ...] = (rocketmq_rule,),
) -> str:
    """Return ``name`` if every rule accepts it; else raise :class:`InvalidNameError`.

    ``owner`` says where the name came from (a listener class, a send) for the message.
    """
    label = kind.replace("_", " ")
    if not isinstance(name, str):
        raise InvalidNameError(
            f"{owner}: {label} must be a string, got {type(name).__name__} {name!r}",
            kind=kind,
            name=name,
        )
    for rule in rules:
        problem = rule(kind, name)
        if problem is not None:
            raise InvalidNameError(
                f"{owner}: {label} {name!r} is not accepted: {problem}. Rename it.",
                kind=kind,
                name=name,
            )
    return name
