"""``python -m txmsg_broker broker ...`` / ``topic create ...`` (used by ``BrokerProcess``)."""

from __future__ import annotations

import click

from .cli import broker, topic


@click.group()
def main() -> None:
    """Embedded RocketMQ-compatible broker."""


main.add_command(broker)
main.add_command(topic)

if __name__ == "__main__":
    main()
