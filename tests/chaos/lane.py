"""How the chaos runs share the machine with the rest of the suite.

Why a lower priority: a chaos run is 11 processes on a fixed wall-clock schedule, and two chaos
lanes run beside the rest of the suite on 2 cores. At ``nice 10`` the runs get what the other tests
leave (the Spark lane's JVMs above all: spark-submit 8-12 s alone, several times that beside
two chaos lanes at full priority); their schedules of strikes and their checks are unchanged
(docs/guide/testing.md, "Real time where real time is the point").
"""

from __future__ import annotations

YIELD_CPU = ["nice", "-n", "10"]
"""The prefix of a chaos run's command line (coreutils ``nice``; its children inherit it)."""
