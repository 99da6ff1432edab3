"""``txmsg outbox status|list|retry|discard|relay``: the operator's side of the outbox.

Like ``txmsg parked``, every command finds the outbox through the application or the database:

* ``--app MODULE:ATTR`` names the application (a :class:`txmsg.TxMsg`, or a zero-argument factory
  returning one) whose ``add_outbox(...)`` declarations give the groups and their databases; the
  current directory is importable.  Reading and changing rows never starts the app.
* ``--database URL`` reads the tables directly (``status``, ``list``, ``retry``, ``discard``);
  ``--group`` narrows to one outbox.

``txmsg outbox relay --app MODULE:ATTR`` runs the relays of the app's outboxes in a process of
its own (for services declared with ``add_outbox(..., relay=False)``, or beside them): it opens
only the outboxes' producers, never the app's listeners or consumers.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from functools import partial, wraps
from types import FrameType
from typing import Any

import click

from txmsg.cli_json import JSON_OPTION, echo_rows, message_json
from txmsg.cli_targets import (
    Target,
    app_option,
    database_errors,
    load_app,
    targets,
    unconfirmed,
    where_options,
    yes_option,
)
from txmsg.errors import TxMsgError
from txmsg.sqla.models import utcnow
from txmsg.sqla.outbox import Relay, store
from txmsg.sqla.outbox.models import OutboxState


def _outboxes_of(reference: str) -> dict[str, Any]:
    app = load_app(reference)
    outboxes = getattr(app, "outboxes", None)
    if not isinstance(outboxes, dict):
        raise click.ClickException(
            f"--app {reference} is a {type(app).__name__}; outboxes are declared on a "
            "txmsg.TxMsg or a txmsg.ListenerRegistry (.add_outbox(group=..., session_factory=...))"
        )
    return outboxes


def _app_outboxes(reference: str, group: str | None) -> list[Any]:
    outboxes = _outboxes_of(reference)
    if not outboxes:
        raise click.ClickException(
            f"--app {reference} declares no outbox; declare one with "
            "app.add_outbox(group=..., session_factory=...)"
        )
    if group is None:
        return [outboxes[g] for g in sorted(outboxes)]
    if group not in outboxes:
        raise click.ClickException(
            f"--app {reference} has no outbox of group {group!r}; its outboxes: "
            f"{', '.join(sorted(outboxes))}"
        )
    return [outboxes[group]]


def _app_targets(reference: str, group: str | None) -> list[Target]:
    return [Target(o.group, o.session_factory) for o in _app_outboxes(reference, group)]


_targets = partial(targets, of_app=_app_targets, where="the outbox")


def _one_line(text: str | None, width: int = 60) -> str:
    text = " ".join((text or "-").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


WHERE_OPTIONS = where_options(
    "Only this outbox (its producer group).", app_help="Your TxMsg app (or a factory returning it)."
)


@click.group()
def outbox() -> None:
    """Show, retry or discard outbox rows; run an outbox relay."""


@outbox.command("status")
@WHERE_OPTIONS
@JSON_OPTION
def status_command(app: str | None, database: str | None, group: str | None, as_json: bool) -> None:
    """Unsent rows, the oldest unsent row's age and dead rows of each outbox."""
    now = utcnow()
    found: list[dict[str, Any]] = []
    with _targets(app, database, group) as targets, database_errors("read the outbox"):
        for target in targets:
            for backlog in store.backlogs(target.sessions, target.group):
                lease = store.read_lease(target.sessions, backlog.group)
                found.append(
                    {
                        "group": backlog.group,
                        "unsent": backlog.unsent,
                        "oldest_unsent_age_seconds": backlog.oldest_unsent_age(now),
                        "dead": backlog.dead,
                        "relay_lease": None
                        if lease is None
                        else {"owner": lease.owner, "until": lease.lease_until.isoformat()},
                    }
                )
    echo_rows(found, as_json, json_of=lambda row: row, line=_status_line, empty="no outbox rows")


def _status_line(row: dict[str, Any]) -> str:
    lease = row["relay_lease"]
    relay = "" if lease is None else f"  relay={lease['owner']}"
    dead = row["dead"]
    return (
        f"{row['group']}  unsent={row['unsent']}  "
        f"oldest_unsent={_age(row['oldest_unsent_age_seconds'])}  dead={dead}{relay}"
        + ("  (txmsg outbox list --dead shows them)" if dead else "")
    )


@outbox.command("list")
@WHERE_OPTIONS
@click.option("--dead", "only_dead", is_flag=True, help="Only dead rows.")
@click.option("--key", help="Only this sharding key (its rows in send order).")
@click.option("--limit", default=100, show_default=True, help="At most this many rows.")
@JSON_OPTION
def list_command(
    app: str | None,
    database: str | None,
    group: str | None,
    only_dead: bool,
    key: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Rows still in the outbox: unsent (due, in back-off, or behind an earlier row of their
    key) and dead, each key's in the order the relay sends them."""
    views: list[store.OutboxRowView] = []
    with _targets(app, database, group) as targets, database_errors("read the outbox"):
        for target in targets:
            views += store.rows(
                target.sessions,
                target.group,
                state=OutboxState.DEAD.value if only_dead else None,
                sharding_key=key,
                limit=limit,
            )
    echo_rows(
        views,
        as_json,
        json_of=_row_json,
        line=_row_line,
        empty="no dead rows" if only_dead else "the outbox is empty",
    )


def _row_line(v: store.OutboxRowView) -> str:
    where = "" if v.sharding_key is None else f"  key={v.sharding_key!r} seq={v.seq}"
    return (
        f"#{v.id}  {v.group}  {v.state}{where}  topic={v.message.topic}  "
        f"attempts={v.attempts}  created={v.created_at.isoformat()}  "
        f"message_key={v.message_key}  error={_one_line(v.last_error)}"
    )


def _row_json(v: store.OutboxRowView) -> dict[str, Any]:
    return {
        "id": v.id,
        "group": v.group,
        "state": v.state,
        "message_key": v.message_key,
        "sharding_key": v.sharding_key,
        "seq": v.seq,
        **message_json(v.message),
        "attempts": v.attempts,
        "next_attempt_at": v.next_attempt_at.isoformat(),
        "last_error": v.last_error,
        "created_at": v.created_at.isoformat(),
        "dead_at": None if v.dead_at is None else v.dead_at.isoformat(),
        "delay_level": v.delay_level,
        "deliver_at_ms": v.deliver_at_ms,
    }


_DEAD_ROW_CHOICE = (
    click.option("--id", "ids", type=int, multiple=True, help="A dead row's id (repeatable)."),
    click.option("--key", help="Every dead row of this sharding key."),
    click.option("--all", "every", is_flag=True, help="Every dead row."),
)


def _dead_row_choice(verb: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``--id`` / ``--key`` / ``--all``: retry and discard pick their dead rows the same way, so
    the options are declared, and read into one ``selection`` argument, once; ``verb`` names the
    command in the usage error."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @wraps(command)
        def run(*, ids: tuple[int, ...], key: str | None, every: bool, **given: Any) -> None:
            command(selection=_selection(ids, key, every, verb), **given)

        for option in reversed(_DEAD_ROW_CHOICE):  # as if stacked above the command, in order
            run = option(run)
        return run

    return decorate


def _selection(ids: tuple[int, ...], key: str | None, every: bool, verb: str) -> dict[str, Any]:
    chosen = sum((bool(ids), key is not None, every))
    if chosen != 1:
        raise click.UsageError(
            f"say which dead rows to {verb}: --id N (repeatable), --key KEY or --all"
        )
    return {"ids": list(ids) if ids else None, "sharding_key": key}


@outbox.command("retry")
@WHERE_OPTIONS
@_dead_row_choice("retry")
def retry_command(
    app: str | None, database: str | None, group: str | None, selection: dict[str, Any]
) -> None:
    """Make dead rows pending again with fresh attempts; a running relay sends them (a key's in
    their order) within its poll interval."""
    retried: list[int] = []
    with _targets(app, database, group) as targets, database_errors("retry dead rows"):
        for target in targets:
            retried += store.retry_dead(target.sessions, target.group, **selection)
    if not retried:
        raise click.ClickException(
            "no dead row matches; `txmsg outbox list --dead` shows the dead rows"
        )
    click.echo(
        f"retrying {len(retried)} row(s): {', '.join(f'#{i}' for i in sorted(retried))}. A running "
        "relay sends them within its poll interval (no relay running? `txmsg outbox relay "
        "--app MODULE:ATTR`); `txmsg outbox status` shows the progress"
    )


@outbox.command("discard")
@WHERE_OPTIONS
@_dead_row_choice("discard")
@yes_option("Really delete them (they are never sent).")
def discard_command(
    app: str | None, database: str | None, group: str | None, selection: dict[str, Any], yes: bool
) -> None:
    """Delete dead rows without sending them; their keys' later rows flow again."""
    with _targets(app, database, group) as targets:
        if not yes:
            with database_errors("read the outbox"):
                doomed = sum(
                    len(
                        store.rows(
                            t.sessions,
                            t.group,
                            state=OutboxState.DEAD.value,
                            limit=1_000_000,
                            **selection,
                        )
                    )
                    for t in targets
                )
            raise unconfirmed(f"{doomed} dead row(s)", "their messages are never sent")
        deleted: list[int] = []
        with database_errors("discard dead rows"):
            for target in targets:
                deleted += store.discard_dead(target.sessions, target.group, **selection)
    if not deleted:
        raise click.ClickException(
            "no dead row matches; `txmsg outbox list --dead` shows the dead rows"
        )
    click.echo(f"discarded {len(deleted)} row(s): {', '.join(f'#{i}' for i in sorted(deleted))}")


@outbox.command("relay")
@app_option(
    "Your TxMsg app (or a factory returning it): its outboxes and configuration.", required=True
)
@click.option("--group", "groups", multiple=True, help="Only this outbox (repeatable).")
@click.option(
    "--drain",
    is_flag=True,
    help="Send what is due now, then exit (instead of relaying until stopped).",
)
def relay_command(app: str, groups: tuple[str, ...], drain: bool) -> None:
    """Run the relays of the app's outboxes in this process until SIGTERM or Ctrl-C."""
    from txmsg.app import TxMsg  # noqa: PLC0415 - the command's own import, loaded when run

    loaded = load_app(app)
    if not isinstance(loaded, TxMsg):  # the relay needs the app's configuration and backend
        raise click.ClickException(
            f"--app {app} is a {type(loaded).__name__}; the relay needs the txmsg.TxMsg that "
            "includes it (its configuration and backend)"
        )
    outboxes = [o for g in (groups or (None,)) for o in _app_outboxes(app, g)]
    # a relay-only app: the same configuration and backend, only the outboxes' producers
    relay_app = TxMsg(loaded.config, backend=loaded._backend_arg)
    for each in outboxes:
        relay_app.add_producer(group=each.group)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    try:
        relay_app.start()
    except TxMsgError as exc:
        raise click.ClickException(f"could not start the relays' producers: {exc}") from exc
    try:
        hooks = loaded.outbox_dead_hooks
        if drain:
            for each in outboxes:
                relay = Relay(each, relay_app.producer(each.group), hooks=hooks)
                try:
                    sent = relay.drain()
                except TxMsgError as exc:
                    raise click.ClickException(str(exc)) from exc
                (backlog,) = store.backlogs(each.session_factory, each.group)
                click.echo(
                    f"{each.group}: sent {sent}; unsent {backlog.unsent} (in back-off or behind "
                    f"a dead row), dead {backlog.dead}"
                )
            return
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            for each in outboxes:
                try:
                    each.start_relay(relay_app.producer(each.group), hooks=hooks)
                except TxMsgError as exc:
                    raise click.ClickException(str(exc)) from exc
            click.echo(f"relaying {', '.join(o.group for o in outboxes)} (SIGTERM or Ctrl-C stops)")
            stop.wait()
        finally:
            for each in outboxes:
                each.stop_relay(loaded.config.close_timeout)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        relay_app.close()
