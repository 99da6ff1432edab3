"""How the chaos runs share the machine with the rest of the suite.

Why a lower priority: a chaos run is 11 processes, and the librocketmq consumers among them pull
an idle queue again as soon as the broker answers (the synchronous pulls of
docs/librocketmq-hazards.md #5: about a core per idle consumer group on an idle machine), so two
chaos lanes took most of a 2-core machine from the tests beside them, the Spark lane's JVMs first
(spark-submit 8-12 s alone, 70-140 s beside the chaos lanes). At ``nice 10`` the runs get what
the other tests leave: their schedules of strikes and their checks are unchanged, the spin
yields first (docs/guide/testing.md, "Real time where real time is the point").
"""

from __future__ import annotations

YIELD_CPU = ["nice", "-n", "10"]
"""The prefix of a chaos run's command line (coreutils ``nice``; its children inherit it)."""
