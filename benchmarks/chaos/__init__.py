"""Chaos run: prove the order sample consistent while processes are ``kill -9``'d at random.

``txmsg chaos`` (or ``python -m benchmarks.chaos``) starts the embedded broker (``--flush sync``),
several order-service producer processes and several idempotent consumer processes per
downstream service, lets a monkey kill random subsets of them, and then checks the databases:
see :mod:`benchmarks.chaos.check` for exactly what is proved.

Modules: ``settings`` (what a run is), ``databases`` (service databases + producer journal),
``roles`` (the child processes), ``procs`` (start/kill/restart), ``monkey`` (the strikes),
``check`` (the invariants), ``run`` (orchestration), ``cli`` (command and table).  Nothing is
imported here, so ``python -m benchmarks.chaos.roles`` starts without loading the orchestrator.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "chaos_command":
        from benchmarks.chaos.cli import chaos_command  # noqa: PLC0415 - lazy: `txmsg --help` stays fast

        return chaos_command
    raise AttributeError(name)
