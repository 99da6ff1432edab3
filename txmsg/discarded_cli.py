"""``txmsg discarded list|retry|discard``: the operator's side of discarded half messages.

The rescue (:mod:`txmsg.rescue`) gives up on a half message the broker discarded when
``check_local`` still had no answer after ``rescue_attempts`` rounds; a group whose listener has a
database (a record-backed listener's ``session_factory``) keeps it there as a dead row
(:mod:`txmsg.sqla.discarded`).  Once the cause is fixed (the record written, the service back),
an operator lists those rows, retries them (``check_local`` is asked again; COMMIT sends the
message to its topic, ROLLBACK deletes the row) or discards them.  The verbs are those of
``txmsg parked`` and ``txmsg outbox`` for the same operator actions.

Like ``txmsg parked`` and ``txmsg outbox``, a command finds the rows through ``--app
MODULE:ATTR`` (the listeners' databases; ``retry`` needs it: it runs ``check_local`` and opens
the group's producer, never the app's consumers) or ``--database URL``.  Dead rows of a listener
without a database exist only in its process (``app.rescuers[group].dead``) and in what the
``@app.on_transaction_discarded`` hooks did with them.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import click

from txmsg.app import load_backend
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
from txmsg.config import TxMsgConfig
from txmsg.errors import TxMsgError
from txmsg.listener import ListenerSpec, bind_spec
from txmsg.rescue import rescued_message
from txmsg.safety import run_check_local
from txmsg.sqla.discarded import DiscardedView, dead_rows, discard_dead
from txmsg.states import LocalTransactionState


def _listener_of(app: Any, spec: ListenerSpec) -> Any:
    """The listener instance the app would use for ``spec`` (its factory, or the instance)."""
    if spec.is_instance:
        listener = spec.target
    else:
        factory = getattr(app, "listener_factory", None)
        try:
            listener = factory(spec.target) if callable(factory) else spec.target()
        except Exception as exc:
            raise click.ClickException(
                f"could not create the listener {spec.name} of group {spec.group!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    bind_spec(listener, spec)
    return listener


def _app_listeners(reference: str, group: str | None) -> tuple[Any, list[tuple[ListenerSpec, Any]]]:
    """The app and its transactional listeners that keep dead rows (only ``group``'s if given),
    each with its instance."""
    app = load_app(reference)
    listeners: dict[str, ListenerSpec] = registry_of(app).listeners
    if group is not None and group not in listeners:
        raise click.ClickException(
            f"--app {reference} has no transactional listener of group {group!r}; its groups: "
            f"{', '.join(sorted(listeners)) or 'none'}"
        )
    chosen = [listeners[group]] if group is not None else [listeners[g] for g in sorted(listeners)]
    found: list[tuple[ListenerSpec, Any]] = []
    for spec in chosen:
        listener = _listener_of(app, spec)
        if callable(getattr(listener, "session_factory", None)):
            found.append((spec, listener))
        elif group is not None:
            raise click.ClickException(
                f"the listener of group {group!r} ({spec.name}) has no database "
                "(session_factory), so its rescuer keeps no dead rows: they were only in its "
                "process (app.rescuers[group].dead), its ERROR lines and the "
                "on_transaction_discarded hooks"
            )
    if not found:
        raise click.ClickException(
            f"no transactional listener of --app {reference} has a database (session_factory: "
            "a txmsg.sqla.RecordBackedListener), so no dead rows are kept"
        )
    return app, found


def _app_targets(reference: str, group: str | None) -> list[Target]:
    _app, found = _app_listeners(reference, group)
    return [Target(spec.group, listener.session_factory) for spec, listener in found]


_targets = partial(targets, of_app=_app_targets, where="the dead rows")


def _rows(targets: list[Target], key: str | None) -> list[tuple[Target, DiscardedView]]:
    out: list[tuple[Target, DiscardedView]] = []
    with database_errors("read the dead rows of discarded half messages"):
        for target in targets:
            out.extend((target, row) for row in dead_rows(target.sessions, target.group, key))
    return out


def _json(row: DiscardedView) -> dict[str, Any]:
    return {
        "id": row.id,
        "group": row.group,
        "transaction_key": row.transaction_key,
        **message_json(row.message),
        "attempts": row.attempts,
        "reason": row.reason,
        "dead_at": row.dead_at.isoformat(),
    }


@click.group()
def discarded() -> None:
    """List, retry or discard discarded half messages the rescuer gave up on."""


@discarded.command("list")
@where_options("Only this producer group.")
@click.option("--key", help="Only this transaction key.")
@JSON_OPTION
def list_command(
    app: str | None, database: str | None, group: str | None, key: str | None, as_json: bool
) -> None:
    """Dead rows of discarded half messages, oldest first."""
    with _targets(app, database, group) as found:
        rows = [row for _target, row in _rows(found, key)]
    echo_rows(rows, as_json, json_of=_json, line=_line, empty="no dead discarded half messages")


def _line(r: DiscardedView) -> str:
    return (
        f"#{r.id}  {r.group}  key={r.transaction_key}  topic={r.message.topic}  "
        f"keys={r.message.keys or '-'}  tags={r.message.tags or '-'}  "
        f"rounds={r.attempts}  dead_at={r.dead_at.isoformat()}  reason={r.reason}"
    )


@discarded.command("retry")
@app_option(
    "Your TxMsg app (or a factory): its check_local decides, its backend sends.", required=True
)
@click.option("--group", required=True, help="The producer group.")
@click.option("--key", help="Only this transaction key (default: every dead row of the group).")
@click.option(
    "--force",
    is_flag=True,
    help="Send without asking check_local (you know the local transactions committed).",
)
def retry_command(app: str, group: str, key: str | None, force: bool) -> None:
    """Ask check_local again for each dead row: COMMIT sends the message to its topic and
    deletes the row, ROLLBACK deletes it, UNKNOW keeps it (exit status 1 if any is kept)."""
    txmsg_app, found = _app_listeners(app, group)
    spec, listener = found[0]
    sessions = listener.session_factory
    rows = [row for _target, row in _rows([Target(group, sessions)], key)]
    if not rows:
        what = f"transaction {key!r}" if key else "nothing"
        raise click.ClickException(
            f"{what} is dead in group {group!r}; `txmsg discarded list --app {app}` shows what is"
        )
    config = getattr(txmsg_app, "config", None)
    if not isinstance(config, TxMsgConfig):
        raise click.ClickException(
            f"--app {app} is a {type(txmsg_app).__name__}; retry needs the txmsg.TxMsg (its "
            "configuration names the backend that sends the messages)"
        )
    try:  # a client of the command's own: the app object is left as it was
        backend = load_backend(config.backend, config)
    except TxMsgError as exc:
        raise click.ClickException(f"--app {app}: {exc}") from exc
    sender = backend.create_transactional_sender(
        group,
        lambda message: run_check_local(listener, message, spec),
        check_concurrency=1,
        topics=spec.topics,
    )
    kept = 0
    try:
        for row in rows:
            message = row.message
            state = (
                LocalTransactionState.COMMIT if force else run_check_local(listener, message, spec)
            )
            if state is LocalTransactionState.COMMIT:
                try:
                    sender.send_in_transaction(
                        rescued_message(message, row.attempts),
                        lambda _m: LocalTransactionState.COMMIT,
                    )
                except TxMsgError as exc:
                    raise click.ClickException(
                        f"{group}  key={row.transaction_key}: could not send it to "
                        f"{message.topic} ({type(exc).__name__}: {exc}); its row is kept"
                    ) from exc
                outcome = f"sent to {message.topic}"
            elif state is LocalTransactionState.ROLLBACK:
                outcome = "rolled back: nothing to send"
            else:
                kept += 1
                click.echo(
                    f"{group}  key={row.transaction_key}: check_local still answers UNKNOW; kept",
                    err=True,
                )
                continue
            with database_errors("delete the dead row"):
                discard_dead(sessions, group, [row.transaction_key])
            click.echo(f"{group}  key={row.transaction_key}: {outcome}; row deleted")
    finally:
        sender.close(10.0)
        backend.close(10.0)
    if kept:
        raise click.ClickException(
            f"{kept} dead row(s) kept: check_local has no answer for them yet; fix the cause and "
            "retry again, `--force` if you know they committed, or `txmsg discarded discard`"
        )


@discarded.command("discard")
@where_options("The producer group.", group_required=True)
@click.option("--key", help="Only this transaction key (default: every dead row of the group).")
@yes_option("Really delete them (the messages are never sent).")
def discard_command(
    app: str | None, database: str | None, group: str, key: str | None, yes: bool
) -> None:
    """Delete dead rows without sending their messages."""
    with _targets(app, database, group) as found:
        rows = _rows(found, key)
        if not rows:
            what = f"transaction {key!r}" if key else "nothing"
            raise click.ClickException(f"{what} is dead in group {group!r}")
        if not yes:
            raise unconfirmed(
                f"{len(rows)} dead row(s) of group {group!r}", "their messages are never sent"
            )
        with database_errors("discard the dead rows"):
            deleted = discard_dead(found[0].sessions, group, None if key is None else [key])
    click.echo(f"{group}: discarded {deleted} dead row(s)")
