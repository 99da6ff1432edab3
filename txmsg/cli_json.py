"""``--json`` of the operator commands (``txmsg parked``, ``txmsg outbox``, ``txmsg discarded``),
and how they show a kept message with it.

Why one place: a script that reads one command's output should read the others' the same
way, so a message's fields are named and encoded (the body as UTF-8 text, undecodable bytes
replaced) in one place.
"""

from __future__ import annotations

from typing import Any

import click

from txmsg.message import Message

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
"""Every listing command takes it, under the one name and parameter."""


def message_json(message: Message) -> dict[str, Any]:
    """The fields a message was sent with, as JSON values (the row's own fields stay with the
    command that knows the row)."""
    return {
        "topic": message.topic,
        "tags": message.tags,
        "keys": message.keys,
        "properties": dict(message.properties),
        "body": message.body.decode("utf-8", errors="replace"),
    }
