"""The hot path's statements, compiled once by SQLAlchemy and run on the driver's cursor.

A RUN turn is a few one-row statements (the generation mark, the turn insert, the mark's
clear), and a stage a few more (the claim, the hand-off). Executing one through a SQLAlchemy
`Connection` cost ~4x the driver's own work: the execution context, the compiled-cache
lookup, parameter and result processing, the result object (a generation mark: 250 us of CPU
against 120 us on the pooled psycopg connection, docs/benchmarks-history.md, "Hot path, round 6"). Here a
statement is compiled for the engine's dialect once; each execution builds its parameters
with that compiled form's own bind processors (JSON columns wrapped for psycopg exactly as
SQLAlchemy wraps them) and runs the SQL text on the DBAPI cursor.

PostgreSQL only: psycopg returns every column type raas reads as the ORM would (timestamptz,
booleans, JSONB). SQLite keeps SQLAlchemy's path, which converts its stored text (timestamps,
JSON, booleans) on the way out; both paths return rows with attribute access and `_mapping`.

Errors come out as SQLAlchemy's (`sqlalchemy.exc.OperationalError` for a dropped or refused
connection, which the stages retry, `tasks.writes.db_retry`), whether the statement, the pool's
checkout or the autocommit switch raised them, and a connection the driver reports broken is
invalidated, as SQLAlchemy does. A column's Python-side default (`created_at`) is filled in
as SQLAlchemy fills it, and an engine's `before_cursor_execute` listeners (SQL logging,
tracing) see these statements too. An IN list fixed in the statement (`status IN (...)`)
is expanded once at compile time; one given at execution (`bindparam(expanding=True)`) is
refused (TypeError), since its SQL text depends on the values.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Executable


@dataclass
class Result:
    """What an execution returned: its rows (empty without RETURNING) and rowcount."""

    rows: list[Any]
    rowcount: int

    def first(self) -> Any:
        """The first row, or None."""
        return self.rows[0] if self.rows else None


@dataclass(frozen=True)
class _Compiled:
    sql: str
    processors: dict[str, Any]
    construct: Any  # the compiled form's construct_params
    defaults: tuple[tuple[str, Any], ...]  # (parameter, column default) SQLAlchemy would fill in
    expanded: dict[str, Any]  # an IN list fixed in the statement, one parameter per value
    unexpanded: tuple[str, ...]  # ...and the list parameters they replace


_row_types: dict[tuple[str, ...], type] = {}
# SQL text -> its rows' type, None for a statement without rows: learnt from the first
# execution's description (psycopg builds a Column object per column each time it is asked).
_rows_of: dict[str, type | None] = {}
_UNKNOWN = object()


# By (statement, dialect): a statement hashes by identity, and the cache keeps it alive; the
# callers pass statements built once (module constants, cached builders), so a few dozen.
@functools.lru_cache(maxsize=512)
def _compile(statement: Executable, dialect: Dialect) -> _Compiled:
    compiled = statement.compile(dialect=dialect)
    prefetch = [(c, c.default) for c in compiled.insert_prefetch] + [(c, c.onupdate) for c in compiled.update_prefetch]
    if any(default.is_sequence or default.is_clause_element for _, default in prefetch):
        raise TypeError("a column default run by the database is not for the driver path")
    key = compiled._within_exec_param_key_getter if prefetch else None  # set for INSERT/UPDATE only
    defaults = tuple((key(column), default) for column, default in prefetch)
    sql, expanded, unexpanded = compiled.string, {}, ()
    if compiled.post_compile_params:  # `status IN (<literal list>)`: expanded once, here
        if any(p.required or p.callable for p in compiled.post_compile_params):
            raise TypeError("an IN list given at execution is not for the driver path")
        plain = compiled.construct_params(_check=False)
        state = compiled._process_parameters_for_postcompile(dict(plain))
        sql, unexpanded = state.statement, tuple(compiled.bind_names[p] for p in compiled.post_compile_params)
        expanded = {name: value for name, value in state.parameters.items() if name not in plain}
    return _Compiled(sql, dict(compiled._bind_processors), compiled.construct_params, defaults, expanded, unexpanded)


def _row_type(names: tuple[str, ...]) -> type:
    """A tuple type with attribute access and `_mapping`, like SQLAlchemy's Row."""
    found = _row_types.get(names)
    if found is None:
        base = namedtuple("Row", names, rename=True)  # noqa: PYI024
        found = type("Row", (base,), {"__slots__": (), "_mapping": property(base._asdict)})
        _row_types[names] = found
    return found


_CURSOR = "raas_driver_cursor"


def _cursor(fairy: Any) -> Any:
    """The pooled connection's cursor, kept with it: psycopg copies the connection's whole
    adapters map into every new cursor (~7 % of an EVAL worker's CPU). A connection serves
    one thread at a time (a pool checkout), so one cursor each is enough."""
    kept = fairy.info.get(_CURSOR)
    if kept is not None and kept[0] is fairy.dbapi_connection and not kept[1].closed:
        return kept[1]
    cursor = fairy.cursor()
    fairy.info[_CURSOR] = (fairy.dbapi_connection, cursor)
    return cursor


def _parameters(compiled: _Compiled, params: dict[str, Any]) -> dict[str, Any]:
    values = compiled.construct(params)
    if compiled.unexpanded:
        for name in compiled.unexpanded:
            del values[name]
        values.update(compiled.expanded)
    for name, default in compiled.defaults:  # a column's Python-side default (created_at, {})
        values[name] = default.arg(None) if default.is_callable else default.arg
    for name, process in compiled.processors.items():
        if name in values:
            values[name] = process(values[name])
    return values


def _run(
    engine: Engine, fairy: Any, compiled: _Compiled, params: dict[str, Any], invalidate: Any, conn: Any = None
) -> Result:
    """Execute on the pooled connection `fairy`; SQLAlchemy's exception on failure, after
    `invalidate(exc)` when the driver says the connection broke (and the pool's connections
    of its generation are marked for recycling, as SQLAlchemy does on a disconnect)."""
    values = _parameters(compiled, params)
    cursor = _cursor(fairy)
    try:
        if engine._has_events:  # SQL logging or tracing listens on the engine: it sees these too
            engine.dispatch.before_cursor_execute(conn, cursor, compiled.sql, values, None, False)
        cursor.execute(compiled.sql, values)
        row = _rows_of.get(compiled.sql, _UNKNOWN)
        if row is _UNKNOWN:
            names = None if cursor.description is None else tuple(c.name for c in cursor.description)
            row = _rows_of[compiled.sql] = None if names is None else _row_type(names)
        if row is None:
            return Result([], cursor.rowcount)
        return Result([row(*values) for values in cursor.fetchall()], cursor.rowcount)
    except engine.dialect.loaded_dbapi.Error as exc:
        broken = engine.dialect.is_disconnect(exc, fairy.dbapi_connection, cursor)
        fairy.info.pop(_CURSOR, None)
        if broken:
            engine.pool._invalidate(fairy, exc, _checkin=False)
            invalidate(exc)
        raise DBAPIError.instance(
            compiled.sql,
            values,
            exc,
            engine.dialect.loaded_dbapi.Error,
            connection_invalidated=broken,
            dialect=engine.dialect,
        ) from exc


def execute(conn: Connection, statement: Executable, params: dict[str, Any]) -> Result:
    """`statement` with `params` inside `conn`'s transaction."""
    engine = conn.engine
    if engine.dialect.name != "postgresql":
        result = conn.execute(statement, params)
        return Result(result.all() if result.returns_rows else [], result.rowcount)
    return _run(engine, conn.connection, _compile(statement, engine.dialect), params, conn.invalidate, conn)


def run_alone(engine: Engine, statement: Executable, params: dict[str, Any]) -> Result:
    """`statement` as its own transaction: on PostgreSQL in autocommit (the server commits
    as the statement ends: one round trip, and no row lock held while this thread waits for
    the GIL to send COMMIT); elsewhere a short transaction (SQLite's BEGIN IMMEDIATE)."""
    if engine.dialect.name != "postgresql":
        with engine.begin() as conn:
            return execute(conn, statement, params)
    compiled = _compile(statement, engine.dialect)
    fairy = _checkout(engine, compiled.sql)
    try:
        _set_autocommit(engine, fairy, True, compiled.sql)
        try:
            return _run(engine, fairy, compiled, params, fairy.invalidate)
        finally:
            if fairy.is_valid:
                _set_autocommit(engine, fairy, False, compiled.sql)
    finally:
        fairy.close()


def _checkout(engine: Engine, sql: str) -> Any:
    """A pooled connection, or SQLAlchemy's error: `engine.raw_connection()` raises the
    driver's own (`psycopg.OperationalError` for a refused connection), which SQLAlchemy's
    `Connection` would have wrapped; unwrapped it escaped the stages' retry (issue 40)."""
    try:
        return engine.raw_connection()
    except engine.dialect.loaded_dbapi.Error as exc:
        raise _wrapped(engine, sql, exc, engine.dialect.is_disconnect(exc, None, None)) from exc


def _set_autocommit(engine: Engine, fairy: Any, on: bool, sql: str) -> None:
    """Switch the pooled connection's autocommit; a connection the server dropped meanwhile
    says so here first (psycopg: "the connection is closed"): invalidated, SQLAlchemy's error."""
    try:
        fairy.driver_connection.autocommit = on
    except engine.dialect.loaded_dbapi.Error as exc:
        fairy.info.pop(_CURSOR, None)
        fairy.invalidate(exc)
        raise _wrapped(engine, sql, exc, True) from exc


def _wrapped(engine: Engine, sql: str, exc: Exception, broken: bool) -> DBAPIError:
    """The driver's `exc` as SQLAlchemy's exception class for it (OperationalError, ...)."""
    return DBAPIError.instance(
        sql, None, exc, engine.dialect.loaded_dbapi.Error, connection_invalidated=broken, dialect=engine.dialect
    )
