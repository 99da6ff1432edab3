"""Where the operator commands (``txmsg parked``, ``txmsg outbox``, ``txmsg discarded``) find
their tables, and the two options (``--app``, ``--database``) that say where.

They find their rows the same two ways, and must clean up and fail the same way:

* ``--app MODULE:ATTR``: the application (:func:`load_app`), whose declarations name the groups
  and their session factories;
* ``--database URL``: the tables directly, through an engine made for the command and disposed
  when it is done (an app's engines are its own);
* a database error becomes a one-line ``ClickException`` that says what to check
  (:func:`database_errors`);
* a command that deletes rows for good deletes nothing without ``--yes`` (:func:`yes_option`),
  and says what it would delete (:func:`unconfirmed`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from sqlalchemy.exc import SQLAlchemyError

from txmsg.sqla.engine import SessionFactory, create_engine, make_session_factory

F = TypeVar("F", bound=Callable[..., Any])

APP_HELP = "Your TxMsg app (or registry, or a factory)."

DATABASE_OPTION = click.option(
    "--database", metavar="URL", help="The service's database (SQLAlchemy URL) instead of --app."
)
"""``--database URL``: the second way every operator command finds its tables (:func:`targets`)."""


def app_option(help_text: str = APP_HELP, *, required: bool = False) -> Callable[[F], F]:
    """``--app MODULE:ATTR``: the first way (:func:`load_app`); ``help_text`` says what the
    command takes from the app, and a command that runs the app's code (a retry, a relay)
    makes it ``required``."""
    return click.option("--app", "app", required=required, metavar="MODULE:ATTR", help=help_text)


def where_options(
    group_help: str, *, group_required: bool = False, app_help: str = APP_HELP
) -> Callable[[F], F]:
    """``--app``, ``--database`` and ``--group``: the three options of every command that reads
    or changes rows (:func:`targets` takes them), declared once; ``group_help`` names what a
    group is to the command."""
    app = app_option(app_help)
    group = click.option("--group", required=group_required, help=group_help)

    def apply(command: F) -> F:
        return app(DATABASE_OPTION(group(command)))

    return apply


def yes_option(help_text: str) -> Callable[[F], F]:
    """``--yes``: a deleting command's consent; ``help_text`` says what is lost with the rows.
    Without it the command raises :func:`unconfirmed`."""
    return click.option("--yes", is_flag=True, help=help_text)


def unconfirmed(what: str, lost: str) -> click.ClickException:
    """The error of a deleting command run without ``--yes``: it would delete ``what`` (a count
    and whose rows), and ``lost`` is what can then never happen to them."""
    return click.ClickException(f"this deletes {what} for good ({lost}); add --yes to do it")


TABLES_FIX = (
    "check the URL, and that the txmsg tables exist (txmsg.sqla.create_tables(engine) creates "
    "them, or add txmsg.sqla.metadata to your Alembic target_metadata)"
)


@dataclass(frozen=True)
class Target:
    """One group to work on, and the database its rows live in."""

    group: str | None
    """None with ``--database`` and no ``--group``: every group in the tables."""
    sessions: SessionFactory


def load_app(reference: str) -> Any:
    """The object ``MODULE:ATTR`` names (``ATTR`` defaults to ``app``), called first when it is
    a factory rather than an app or registry."""
    module_name, _, attr = reference.partition(":")
    attr = attr or "app"
    if not module_name:
        raise click.BadParameter(f"{reference!r}: use MODULE:ATTR, e.g. myservice.main:app")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `flask --app`: the project you stand in is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.ClickException(
            f"--app {reference}: cannot import {module_name} ({exc}); run the command from the "
            "project root or install the project in this environment"
        ) from exc
    try:
        found: Any = getattr(module, attr)
    except AttributeError:
        raise click.ClickException(
            f"--app {reference}: module {module_name} has no attribute {attr!r}"
        ) from None
    if registry_of(found) is None and callable(found):
        found = found()
    if registry_of(found) is None:
        raise click.ClickException(
            f"--app {reference} is a {type(found).__name__}, not a txmsg.TxMsg, a "
            "ListenerRegistry or a factory returning one"
        )
    return found


def registry_of(obj: Any) -> Any:
    registry = getattr(obj, "registry", obj)
    consumers = getattr(type(registry), "consumers", None)
    return registry if isinstance(consumers, property) else None


@contextmanager
def targets(
    app: str | None,
    database: str | None,
    group: str | None,
    *,
    of_app: Callable[[str, str | None], list[Target]],
    where: str,
) -> Iterator[list[Target]]:
    """The groups a command works on: ``of_app(reference, group)`` for ``--app``, or one target
    on an engine made for ``--database`` (disposed after).  ``where`` says what the command looks
    for ("the parked messages", "the outbox") in the error when neither option is given."""
    if app is not None and database is not None:
        raise click.UsageError("give --app or --database, not both")
    if app is not None:
        yield of_app(app, group)
        return
    if database is not None:
        try:
            engine = create_engine(database)
        except Exception as exc:
            raise click.ClickException(f"--database {database}: {exc}") from exc
        try:
            yield [Target(group, make_session_factory(engine))]
        finally:
            engine.dispose()
        return
    raise click.UsageError(
        f"say where {where} is: --app MODULE:ATTR (your TxMsg app) or --database URL (the "
        "service's database)"
    )


@contextmanager
def database_errors(what: str) -> Iterator[None]:
    """A database error inside becomes ``could not <what>: <error>; <what to check>``."""
    try:
        yield
    except SQLAlchemyError as exc:
        raise click.ClickException(
            f"could not {what}: {type(exc).__name__}: {str(exc).splitlines()[0]}; {TABLES_FIX}"
        ) from exc
