"""The ``txmsg`` command line.

Subcommands are plugins, found the way backends are: a distribution registers a click command
under the entry-point group ``txmsg.commands`` (``name = "module:attribute"``).  txmsg itself
names no command module here, so a part that is not installed properly (a dependency missing)
breaks only its own command, which then explains why and how to fix it.

Nothing is imported before it is used: ``txmsg --help`` reads each command's summary from its
source (the docstring of the function the entry point names) instead of importing it, so the
help stays fast however heavy a command's imports are.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

import click

COMMANDS_GROUP = "txmsg.commands"
"""Entry-point group of ``txmsg`` subcommands (values are ``module:attribute`` of click commands)."""

SETUP_FIX = (
    "install the distribution that provides it with pip (`pip install 'txmsg[rocketmq]'`, "
    "`[rocketmq5]`, `[broker]`, `[health]` or `[demo]`; the error above names the missing module), "
    "then `txmsg doctor`"
)


def command_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed subcommands by name (the first registration of a name wins)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=COMMANDS_GROUP):
        found.setdefault(ep.name, ep)
    return found


def _unavailable(name: str, reason: str) -> click.Command:
    """A stand-in command that explains why the real one cannot load, and how to fix it."""

    def run() -> None:
        raise click.ClickException(f"`txmsg {name}` is unavailable: {reason}. Fix: {SETUP_FIX}.")

    return click.Command(name, callback=run, help=f"(unavailable: {reason})")


def _source_file(module: str) -> Path | None:
    """Where ``module``'s source is, found without importing it (or any package above it)."""
    loaded = sys.modules.get(module)
    if loaded is not None:
        file = getattr(loaded, "__file__", None)
        return Path(file) if file else None
    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.origin else None
    locations = [Path(p) for p in spec.submodule_search_locations or ()]
    for index, part in enumerate(rest):
        last = index == len(rest) - 1
        next_locations: list[Path] = []
        for location in locations:
            if last and (location / f"{part}.py").is_file():
                return location / f"{part}.py"
            if (location / part).is_dir():
                next_locations.append(location / part)
        locations = next_locations
    for location in locations:
        if (location / "__init__.py").is_file():
            return location / "__init__.py"
    return None


def summary(ep: importlib.metadata.EntryPoint) -> str | None:
    """The docstring of the function ``ep`` names, read from source; ``None`` when not found
    (the module is missing, or the attribute is not a plain function definition)."""
    path = _source_file(ep.module)
    if path is None or path.suffix != ".py":
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == ep.attr:
            return ast.get_docstring(node)
    return None


class PluginGroup(click.Group):
    """A click group whose subcommands are the ``txmsg.commands`` entry points, each imported
    on first use."""

    @staticmethod
    def entry_points(ctx: click.Context) -> dict[str, importlib.metadata.EntryPoint]:
        """Scanned once per invocation (cached on the root context, not on the group)."""
        meta = ctx.find_root().meta
        if COMMANDS_GROUP not in meta:
            meta[COMMANDS_GROUP] = command_entry_points()
        found: dict[str, importlib.metadata.EntryPoint] = meta[COMMANDS_GROUP]
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.entry_points(ctx)))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        ep = self.entry_points(ctx).get(cmd_name)
        if ep is None:
            return None
        try:
            command: Any = ep.load()
        except ImportError as exc:
            return _unavailable(cmd_name, f"{ep.value} cannot be imported ({exc})")
        if not isinstance(command, click.Command):
            raise click.ClickException(
                f"entry point {cmd_name} = {ep.value} (group {COMMANDS_GROUP}) is not a click command"
            )
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Like click's, but summaries come from source, so listing imports no command."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows: list[tuple[str, str]] = []
        for name in names:
            command = self.commands.get(name)
            if command is not None:
                rows.append((name, command.get_short_help_str(limit)))
                continue
            ep = self.entry_points(ctx)[name]
            doc = summary(ep)
            if doc is None and _source_file(ep.module) is None:
                doc = f"(unavailable: module {ep.module} not found; run `txmsg {name}` for the fix)"
            rows.append((name, click.Command(name, help=doc).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=PluginGroup)
@click.version_option(package_name="txmsg")
def main() -> None:
    """txmsg: RocketMQ transactional messages for Python services."""
