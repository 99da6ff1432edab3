"""One non-locking SELECT of one column, run with as little around it as the database allows.

Why: the parked-key checks of an orderly listener run before every message it consumes, and
what usually surrounds a query (a Session; on a pooled SQLAlchemy connection, its BEGIN and
ROLLBACK) costs far more than the query itself (docs/guide/ordered.md#measured).  On SQLite
txmsg's engines run the driver in autocommit (:mod:`txmsg.sqla.engine`) and a single SELECT in
WAL mode reads the last committed state, so the driver's own cursor is as correct as a
transaction around it would be.  Other databases use the pooled connection; a session factory
that is not a ``sessionmaker`` bound to an engine gets the Session path.  Each read states only
its statement; how it runs is written here once.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select
from sqlalchemy.dialects.sqlite import dialect as sqlite_dialect

from txmsg.sqla.engine import SessionFactory, bound_engine, read_only


class QuickSelect:
    """A one-column SELECT with named bind parameters, compiled for SQLite's DB-API once."""

    __slots__ = ("_sqlite_names", "_sqlite_sql", "statement")

    def __init__(self, statement: Select[Any]) -> None:
        self.statement = statement
        compiled = statement.compile(dialect=sqlite_dialect())
        self._sqlite_sql = str(compiled)
        """Its SQL with ``?`` placeholders, filled in the order of ``_sqlite_names``."""
        self._sqlite_names = tuple(compiled.positiontup or ())

    def values(self, session_factory: SessionFactory, **params: Any) -> list[Any]:
        """The selected column of every row, read the cheapest correct way (module docstring)."""
        engine = bound_engine(session_factory)
        if engine is not None:
            if engine.dialect.name == "sqlite":
                raw = engine.raw_connection()
                try:
                    cursor = raw.cursor()
                    try:
                        cursor.execute(
                            self._sqlite_sql, tuple(params[name] for name in self._sqlite_names)
                        )
                        return [row[0] for row in cursor.fetchall()]
                    finally:
                        cursor.close()
                finally:
                    raw.close()
            with engine.connect() as connection:
                return list(connection.scalars(self.statement, params))
        with session_factory() as session, session.begin():
            read_only(session)
            return list(session.scalars(self.statement, params))
