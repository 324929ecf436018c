"""What a command says when an expected condition stops it: one line, the cause and the fix.

An operator who types a command the demo printed, against a stack that is down or a database
that was never migrated, should read what is wrong and what to type next, not 150 lines of
traceback (issue 39). Every command's exceptions pass through :func:`classify`, in one place
(the CLI's root group, :mod:`agentledger.cli.group`); the conditions it knows become one line
and an exit code, anything else stays a traceback (a bug to report), and ``--debug`` shows the
traceback of everything.

Exit codes: 2 the ledger or a service refused the request (an :class:`AgentLedgerError`: its
stable code first, as before), 3 something the command needs does not answer (PostgreSQL,
Kafka, the console), 4 the setup is incomplete (a missing or invalid setting, no such
database, a database that is not migrated, a refused login).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import pydantic
from confluent_kafka import KafkaError, KafkaException
from pydantic_settings import BaseSettings, SettingsError

from agentledger import errors, settings
from agentledger.cli import context

REFUSED, UNREACHABLE, SETUP = 2, 3, 4

# SQLSTATEs of a database the migrations never ran on: no table, no function, no schema.
NOT_MIGRATED = frozenset({"42P01", "42883", "3F000"})
NO_DATABASE = "3D000"
LOGIN_REFUSED = frozenset({"28P01", "28000"})
STARTING = "57P03"
# "role ... does not exist" (SET ROLE to a role the migrations create): invalid_parameter_value.
NO_ROLE = "22023"
# librdkafka's codes for "no broker answered".
KAFKA_DOWN = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                        KafkaError._TIMED_OUT, KafkaError._RESOLVE})


@dataclass(frozen=True)
class Failure:
    """One line for the terminal: ``code: cause`` and, when known, what to do."""

    code: str
    cause: str
    fix: str | None
    exit_code: int

    def line(self) -> str:
        return f"{self.code}: {self.cause}" + (f" — {self.fix}" if self.fix else "")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _sqlstate(exc: BaseException) -> str | None:
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    return state if isinstance(state, str) else None


def _ledger() -> str:
    """The configured ledger as ``host:port/database`` (never its password)."""
    try:
        url = urlsplit(settings.load().database_url)
    except Exception:  # the settings themselves may be what failed
        return "the ledger database"
    return f"{url.hostname}:{url.port or 5432}{url.path}"


def _kafka() -> str:
    try:
        return settings.load().kafka_bootstrap
    except Exception:
        return "the configured bootstrap servers"


def _setting_names(exc: pydantic.ValidationError) -> list[str]:
    """The environment variables behind the invalid fields of a settings class."""
    classes = {cls.__name__: cls for cls in _subclasses(BaseSettings)}
    cls = classes.get(exc.title)
    names = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        info = cls.model_fields.get(field) if cls is not None else None
        alias = info.validation_alias if info is not None else None
        if isinstance(alias, str):
            names.append(alias)
        elif field.startswith(context.PREFIX):  # already the alias: the variable itself
            names.append(field)
        elif cls is not None:
            names.append(f"{cls.model_config.get('env_prefix', '')}{field}".upper())
        else:
            names.append(field)
    return names


def _unparsable(exc: SettingsError) -> list[str]:
    """The set variables behind a value pydantic-settings could not parse (its message names
    the field only): every settings class's variable for that field that is set."""
    found = re.search(r'field "([^"]+)"', str(exc))
    if not found:
        return []
    field = found[1]
    names = {f"{cls.model_config.get('env_prefix', '')}{field}".upper()
             for cls in _subclasses(BaseSettings) if field in cls.model_fields}
    return sorted(name for name in names if name in os.environ)


def _subclasses(cls: type[BaseSettings]) -> Iterator[type[BaseSettings]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def classify(exc: BaseException) -> Failure | None:
    """The one-line account of an expected failure, or None for anything else."""
    cli = context.cli_command()
    for cause in _chain(exc):
        state = _sqlstate(cause)
        if state in NOT_MIGRATED or (state == NO_ROLE and "agentledger_" in str(cause)):
            return Failure("not_migrated", f"the database {_ledger()} has no agentledger "
                           f"schema ({str(cause).strip()})",
                           f"apply the migrations: {cli} migrate", SETUP)
        if state == NO_DATABASE:
            return Failure("no_database", f"{_ledger()} does not exist",
                           "check AGENTLEDGER_DATABASE_URL (`make demo` creates the demo's "
                           "ledger, `make up` the stack's)", SETUP)
        if state in LOGIN_REFUSED:
            return Failure("login_refused", f"PostgreSQL refused the login to {_ledger()}",
                           "check the user and password in AGENTLEDGER_DATABASE_URL", SETUP)
        if state == STARTING:
            return Failure("postgres_starting", f"PostgreSQL at {_ledger()} is starting up",
                           "try again in a few seconds", UNREACHABLE)
    for cause in _chain(exc):
        if isinstance(cause, errors.AgentLedgerError):
            return Failure(cause.code, cause.message, None, REFUSED)
        if isinstance(cause, pydantic.ValidationError) and cause.title.endswith("Settings"):
            names = ", ".join(_setting_names(cause)) or cause.title
            first = cause.errors()[0]["msg"] if cause.errors() else "invalid"
            return Failure("invalid_setting", f"{names}: {first}",
                           "set it in the environment (or in .local/env)", SETUP)
        if isinstance(cause, SettingsError):
            return Failure("invalid_setting", f"{', '.join(_unparsable(cause)) or cause}: "
                           "not a value it can read (JSON expected?)",
                           "fix it in the environment (or in the file it came from)", SETUP)
        if isinstance(cause, KafkaException) and cause.args and isinstance(
                cause.args[0], KafkaError) and cause.args[0].code() in KAFKA_DOWN:
            return Failure("kafka_unreachable", f"Kafka does not answer at {_kafka()}",
                           "start the stack: make up (make status shows what runs)",
                           UNREACHABLE)
        if isinstance(cause, httpx.TransportError):
            where = cause.request.url if _has_request(cause) else "the service"
            return Failure("unreachable", f"nothing answers at {where} "
                           f"({type(cause).__name__})",
                           f"is the demo running? {cli} status", UNREACHABLE)
        if _refused_connection(cause):
            return Failure("postgres_unreachable", f"PostgreSQL does not answer at "
                           f"{_ledger()} ({cause})",
                           "start the stack: make up (make status shows what runs)",
                           UNREACHABLE)
    return None


def _has_request(exc: httpx.TransportError) -> bool:
    try:
        exc.request  # noqa: B018 - raises when the error carries no request
    except RuntimeError:
        return False
    return True


def _refused_connection(exc: BaseException) -> bool:
    """A connection to the database that could not be opened (asyncpg raises the socket's
    OSError as it is; psycopg2 an OperationalError without a SQLSTATE)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                  errno.ENETUNREACH, errno.ENOENT):
        return _from_driver(exc)
    if isinstance(exc, OSError) and "Multiple exceptions" in str(exc):  # asyncpg, v4 and v6
        return _from_driver(exc)
    module = type(exc).__module__
    return module.startswith("psycopg2") and type(exc).__name__ == "OperationalError" and (
        "could not connect" in str(exc) or "Connection refused" in str(exc))


def _from_driver(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith(("asyncpg", "psycopg2")):
            return True
        tb = tb.tb_next
    return False
