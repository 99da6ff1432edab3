"""Names that librocketmq 2.1.0 can log without crashing the process.

Why: librocketmq 2.1.0 passes text containing group and topic names as the *format string* of
its printf-style logger (``LOG_INFO(ss.str().c_str())`` in ``Rebalance::doRebalance``, and
``LOG_ERROR(e.what())`` for exceptions naming a topic; fixed upstream in 2.2.0,
apache/rocketmq-client-cpp#285).  A consumer group's retry topic is ``%RETRY%<group>`` and its
dead-letter topic ``%DLQ%<group>``, so a group called ``stock-events`` produces ``%stock...``
= ``%s`` + "tock...", and vsnprintf dereferences a garbage pointer: observed as a segfault in
``StartPushConsumer`` the first time the rebalance result is logged.

:func:`printf_hazard` finds the ``%`` sequences that make vsnprintf read memory (``%s``, ``%S``,
``%n`` with any flags/width/length, and positional ``%N$``); the backend refuses such names with
a message saying what to rename.  Conversions like ``%d`` or ``%o`` only print garbage numbers
into the client log; unknown ones (``%R`` of ``%RETRY%``) are printed literally.
"""

from __future__ import annotations

import re

from ._errors import InvalidNameError

_FLAGS = "-+ #0'I"
_LENGTH = "hlLqjzZt"
_DANGEROUS = "sSn"
SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def printf_hazard(text: str) -> str | None:
    """The first conversion in ``text`` that would make vsnprintf touch memory, else None."""
    i = 0
    while True:
        i = text.find("%", i)
        if i < 0 or i + 1 >= len(text):
            return None
        j = i + 1
        if text[j] == "%":
            i = j + 1
            continue
        while j < len(text) and (text[j] in _FLAGS or text[j].isdigit() or text[j] in ".*$"):
            if text[j] == "$":
                return text[i : j + 1]
            j += 1
        while j < len(text) and text[j] in _LENGTH:
            j += 1
        if j < len(text) and text[j] in _DANGEROUS:
            return text[i : j + 1]
        i = j


def refuse_printf_topic(topic: str) -> None:
    """Raise :class:`InvalidNameError` if sending to ``topic`` would crash librocketmq 2.1.0.

    Why at every send (plain and transactional): the app checks names when listeners are declared,
    but a send may name any topic, and the client logs it as a printf format (module docstring).
    """
    hazard = printf_hazard(topic)
    if hazard is not None:
        raise InvalidNameError(
            f"topic {topic!r} contains {hazard!r}, which librocketmq 2.1.0 would use "
            "as a printf conversion in its log and crash; rename the topic",
            kind="topic",
            name=topic,
        )


def consumer_names_hazard(group: str, topic: str) -> str | None:
    """What librocketmq 2.1.0 would choke on for a consumer of ``group`` on ``topic``."""
    for text in (f"%RETRY%{group}", f"%DLQ%{group}", topic, group):
        found = printf_hazard(text)
        if found is not None:
            return f"{text!r} contains {found!r}"
    return None


def safe_component(name: str) -> str:
    """``name`` reduced to characters that are safe in instance and helper-group names."""
    return SAFE_NAME.sub("_", name)


def name_rule(kind: str, name: str) -> str | None:
    """txmsg's name rule for this backend (entry point ``txmsg.name_rules: rocketmq``).

    The app runs it when a listener is registered and when a message is sent, so a name that
    would crash librocketmq 2.1.0 is refused with what to rename, long before ``start()``.
    ``kind`` is ``producer_group``, ``consumer_group`` or ``topic``.
    """
    texts = [name]
    if kind == "consumer_group":  # the client logs the group's retry and DLQ topics too
        texts = [f"%RETRY%{name}", f"%DLQ%{name}", name]
    for text in texts:
        found = printf_hazard(text)
        if found is not None:
            where = "" if text == name else f" (as {text!r}, which the client derives from it)"
            return (
                f"it contains {found!r}{where}, which librocketmq 2.1.0 uses as a printf "
                "conversion in its own log and crashes on (apache/rocketmq-client-cpp#285; fixed "
                "in 2.2.0). Avoid '%' before s, S or n; for a consumer group avoid a leading s, S "
                "or n (e.g. prefix it with 'cg-')"
            )
    return None
