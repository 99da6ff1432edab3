"""The ``txmsg`` command line.

Subcommands live in the modules that own them and are imported only when used, so
``txmsg --help`` stays fast and a missing optional part (e.g. PySpark) breaks only its own command.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# name -> "module:attribute" of a click command
LAZY_COMMANDS: dict[str, str] = {
    "doctor": "txmsg.doctor:doctor",
    "broker": "txmsg_broker.cli:broker",
    "topic": "txmsg_broker.cli:topic",
    "health": "txmsg_health.cli:health",
    "demo": "samples.order.demo:demo",
    "chaos": "benchmarks.chaos:chaos_command",
    "bench": "benchmarks.__main__:bench_command",
}


def _unavailable(name: str, reason: str) -> click.Command:
    """A stand-in command that explains why the real one cannot load."""

    def run() -> None:
        raise click.ClickException(
            f"`txmsg {name}` is unavailable: {reason}. Run `make setup` to install every part."
        )

    return click.Command(name, callback=run, help=f"(unavailable: {reason})")


class LazyGroup(click.Group):
    """A click group that imports each subcommand on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        target = LAZY_COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            return _unavailable(cmd_name, str(exc))
        command: Any = getattr(module, attr)
        if not isinstance(command, click.Command):
            raise click.ClickException(f"{target} is not a click command")
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="txmsg")
def main() -> None:
    """txmsg: RocketMQ transactional messages for Python services."""
