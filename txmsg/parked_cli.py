"""``txmsg parked list|retry|discard``: the operator's side of parked orderly keys.

An orderly listener that keeps failing on a message parks its sharding key in the service's
database (:mod:`txmsg.orderly`).  These commands show what is parked, retry it through the same
listener once the cause is fixed (``txmsg outbox retry`` is the outbox's twin), or drop it:

* ``--app MODULE:ATTR`` names the application (a :class:`txmsg.TxMsg`, a
  :class:`txmsg.ListenerRegistry`, or a zero-argument factory returning one), like Flask's
  ``--app``; the database is the ``session_factory`` of the group's orderly listener.  The
  current directory is importable, so ``--app myservice.main:app`` works from the project root.
  ``retry`` needs it (it runs the listener); it never starts the app or connects to RocketMQ.
* ``--database URL`` reads the tables directly (``list`` and ``discard`` only).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, cast

import click

from txmsg.cli_json import JSON_OPTION, echo_rows, message_json
from txmsg.cli_targets import (
    Target,
    app_option,
    database_errors,
    load_app,
    registry_of,
    targets,
    unconfirmed,
    where_options,
    yes_option,
)
from txmsg.consumer import ConsumerSpec
from txmsg.sqla.engine import SessionFactory
from txmsg.sqla.parking import ParkedKeyView, discard, parked_keys, parked_messages, replay


def _app_specs(reference: str, group: str | None) -> list[tuple[str, ConsumerSpec, SessionFactory]]:
    """The orderly listeners of the app (only ``group``'s, if given) with their databases."""
    consumers: dict[str, ConsumerSpec] = registry_of(load_app(reference)).consumers
    orderly: dict[str, tuple[str, ConsumerSpec, SessionFactory]] = {
        g: (g, s, cast(SessionFactory, s.session_factory))
        for g, s in sorted(consumers.items())
        if s.orderly and s.session_factory is not None
    }
    if group is None:
        if not orderly:
            raise click.ClickException(
                f"--app {reference} has no orderly message listener "
                f"(consumer groups: {', '.join(sorted(consumers)) or 'none'}); only "
                "@message_listener(..., orderly=True) parks messages"
            )
        return list(orderly.values())
    spec = consumers.get(group)
    if spec is None:
        raise click.ClickException(
            f"--app {reference} has no message listener of group {group!r}; its orderly "
            f"groups: {', '.join(orderly) or 'none'}"
        )
    if group not in orderly:
        raise click.ClickException(
            f"group {group!r} ({spec.name}) is not an orderly listener, so nothing of it is "
            "parked: failed messages of a concurrent listener are redelivered by the broker and "
            f"end in its dead-letter queue (%DLQ%{group})"
        )
    return [orderly[group]]


def _app_targets(reference: str, group: str | None) -> list[Target]:
    return [Target(g, sessions) for g, spec, sessions in _app_specs(reference, group)]


_targets = partial(targets, of_app=_app_targets, where="the parked messages")


def _keys(targets: list[Target], key: str | None) -> list[ParkedKeyView]:
    found: list[ParkedKeyView] = []
    with database_errors("read the parked keys"):
        for target in targets:
            found.extend(parked_keys(target.sessions, target.group))
    return [k for k in found if key is None or k.sharding_key == key]


def _one_line(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


APP_OPTION_HELP = "Your TxMsg app (or registry, or a factory); its listener runs the messages."


@click.group()
def parked() -> None:
    """Show, retry or discard messages that orderly listeners parked."""


@parked.command("list")
@where_options("Only this consumer group.")
@click.option("--key", help="Show the parked messages of this sharding key.")
@JSON_OPTION
def list_command(
    app: str | None, database: str | None, group: str | None, key: str | None, as_json: bool
) -> None:
    """Parked keys (oldest first), or with --key the messages parked under it, in order."""
    with _targets(app, database, group) as targets:
        _list(targets, group, key, as_json)


def _list(targets: list[Target], group: str | None, key: str | None, as_json: bool) -> None:
    keys = _keys(targets, key)
    if key is None:
        echo_rows(keys, as_json, json_of=_key_json, line=_key_line, empty="nothing parked")
        return
    sessions = {t.group: t.sessions for t in targets}
    rows: list[dict[str, Any]] = []
    with database_errors("read the parked messages"):
        for k in keys:
            factory = sessions.get(k.group) or sessions[None]
            rows.extend(_message_json(v) for v in parked_messages(factory, k.group, k.sharding_key))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        raise click.ClickException(
            f"key {key!r} is not parked{_in_group(group)}; `txmsg parked list` shows what is"
        )
    for row in rows:
        click.echo(
            f"#{row['id']}  {row['group']}  key={row['sharding_key']!r}  "
            f"message={row['message_key']}  msgId={row['message_id']}  tags={row['tags']}  "
            f"attempts={row['attempts']}  error={_one_line(row['error'] or '-')}"
        )


def _in_group(group: str | None) -> str:
    return "" if group is None else f" in group {group!r}"


def _key_line(k: ParkedKeyView) -> str:
    return (
        f"{k.group}  key={k.sharding_key!r}  messages={k.messages}  "
        f"parked_at={k.parked_at.isoformat()}  topic={k.topic}  reason={_one_line(k.reason)}"
    )


def _key_json(k: ParkedKeyView) -> dict[str, Any]:
    return {
        "group": k.group,
        "sharding_key": k.sharding_key,
        "topic": k.topic,
        "messages": k.messages,
        "parked_at": k.parked_at.isoformat(),
        "reason": k.reason,
        "first_message_id": k.first_message_id,
    }


def _message_json(view: Any) -> dict[str, Any]:
    m = view.message
    return {
        "id": view.id,
        "group": view.group,
        "sharding_key": view.sharding_key,
        "message_key": view.message_key,
        "message_id": m.message_id,
        **message_json(m),
        "attempts": view.attempts,
        "error": view.error,
        "parked_at": view.parked_at.isoformat(),
    }


@parked.command("retry")
@app_option(APP_OPTION_HELP, required=True)
@click.option("--group", help="Only this consumer group (default: every orderly group).")
@click.option("--key", help="Only this sharding key (default: every parked key).")
def retry_command(app: str, group: str | None, key: str | None) -> None:
    """Retry parked messages: hand them to their listener again, in their original order; release each key
    whose messages all succeed (exit status 1 if any key stays parked)."""
    specs = _app_specs(app, group)
    targets = [Target(g, sessions) for g, spec, sessions in specs]
    if key is not None and not _keys(targets, key):
        raise click.ClickException(
            f"key {key!r} is not parked{_in_group(group)}; `txmsg parked list --app {app}` "
            "shows what is"
        )
    failed = replayed = 0
    for target_group, spec, sessions in specs:
        with database_errors(f"retry group {target_group}"):
            report = replay(spec, sessions, target_group, key)
        for done in report.keys:
            replayed += 1
            if done.error is None:
                click.echo(
                    f"{done.group}  key={done.sharding_key!r}: replayed {done.replayed}, released"
                )
            else:
                failed += 1
                click.echo(
                    f"{done.group}  key={done.sharding_key!r}: replayed {done.replayed}, then "
                    f"message {done.failed_message_key} failed again ({done.error}); the key "
                    "stays parked",
                    err=True,
                )
    if not replayed:
        click.echo("nothing parked")
    if failed:
        raise click.ClickException(
            f"{failed} key(s) still parked: fix the cause and retry again, or drop a message "
            "with `txmsg parked discard ... --message KEY --yes`"
        )


@parked.command("discard")
@where_options("The consumer group.", group_required=True)
@click.option("--key", required=True, help="The parked sharding key.")
@click.option(
    "--message", "message_key", metavar="KEY", help="Only this message (UNIQ_KEY / message id)."
)
@yes_option("Really delete them (they are never handled).")
def discard_command(
    app: str | None,
    database: str | None,
    group: str,
    key: str,
    message_key: str | None,
    yes: bool,
) -> None:
    """Delete parked messages without handling them; a key left empty is released."""
    with _targets(app, database, group) as targets:
        _discard(targets[0], group, key, message_key, yes)


def _discard(target: Target, group: str, key: str, message_key: str | None, yes: bool) -> None:
    with database_errors("read the parked messages"):
        rows = parked_messages(target.sessions, group, key)
    doomed = [r for r in rows if message_key is None or r.message_key == message_key]
    if not doomed:
        what = f"message {message_key!r} of key {key!r}" if message_key else f"key {key!r}"
        raise click.ClickException(
            f"{what} is not parked in group {group!r}; `txmsg parked list --group {group} "
            f"--key {key}` shows what is"
        )
    if not yes:
        raise unconfirmed(
            f"{len(doomed)} parked message(s) of key {key!r}", "the listener never handles them"
        )
    with database_errors("discard"):
        deleted = discard(target.sessions, group, key, message_key)
    left = len(rows) - deleted
    click.echo(
        f"{group}  key={key!r}: discarded {deleted}"
        + (f"; {left} still parked (retry them)" if left else "; key released")
    )
