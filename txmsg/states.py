"""Local transaction states, spelled the way both Java and Python users expect."""

from __future__ import annotations

import enum


class LocalTransactionState(enum.Enum):
    """Answer of a local transaction or of a check-back.

    ``UNKNOW`` is RocketMQ's own (Java) spelling; ``UNKNOWN`` is an alias of the same member so
    Python users can write the natural word.  The values match the C API's
    ``E_COMMIT_TRANSACTION=0``, ``E_ROLLBACK_TRANSACTION=1``, ``E_UNKNOWN_TRANSACTION=2``.
    """

    COMMIT = 0
    ROLLBACK = 1
    UNKNOW = 2
    UNKNOWN = 2  # alias: LocalTransactionState.UNKNOWN is LocalTransactionState.UNKNOW

    @classmethod
    def coerce(cls, value: object) -> LocalTransactionState | None:
        """Return the state ``value`` stands for, or None when it is not a valid answer.

        Accepts members and (case-insensitive) names; booleans, ints and anything else are
        rejected on purpose: an ambiguous answer must become UNKNOW, never a guessed COMMIT.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.__members__.get(value.strip().upper())
        return None
