"""``python -m txmsg_broker broker ...`` / ``namesrv ...`` / ``topic create ...`` (used by ``BrokerProcess``
and ``cluster.BrokerCluster``)."""

from __future__ import annotations

import click

from .cli import broker, namesrv, topic


@click.group()
def main() -> None:
    """Embedded RocketMQ-compatible broker."""


main.add_command(broker)
main.add_command(namesrv)
main.add_command(topic)

if __name__ == "__main__":
    main()
