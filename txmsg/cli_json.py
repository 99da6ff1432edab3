"""``--json`` of the operator commands (``txmsg parked``, ``txmsg outbox``, ``txmsg discarded``),
how they show a kept message with it, and how a listing shows its rows with or without it.

Why one place: a script that reads one command's output should read the others' the same
way, so a message's fields are named and encoded (the body as UTF-8 text, undecodable bytes
replaced) in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from txmsg.message import Message

R = TypeVar("R")

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


def echo_rows(
    rows: Sequence[R],
    as_json: bool,
    *,
    json_of: Callable[[R], Any],
    line: Callable[[R], str],
    empty: str,
) -> None:
    """A listing command's output: with ``--json`` one JSON array (an empty one when nothing is
    found, so a script reads one shape), else ``empty`` when nothing is found or a line per row."""
    if as_json:
        click.echo(json.dumps([json_of(row) for row in rows], indent=2))
    elif not rows:
        click.echo(empty)
    else:
        for row in rows:
            click.echo(line(row))
