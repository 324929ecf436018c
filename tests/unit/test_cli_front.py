"""The command line's shared front (issue 39): one-line failures, the checkout's context, help.

- an expected failure becomes one line naming the cause and the fix, with its exit code;
  anything else is left a traceback (:mod:`agentledger.cli.failures`);
- a command reads what the shell leaves unset from the demo's and the stack's files, the
  demo's only for operator commands, neither when the environment names a ledger
  (:mod:`agentledger.cli.context`);
- a flag's help shows no ``<bool>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic_settings import SettingsError
from typer.testing import CliRunner

from agentledger import cli, errors, operators, settings
from agentledger.cli import context, failures


def _raised(exc: BaseException, wrap: type[Exception] | None = None) -> BaseException:
    """``exc`` as raised (with a traceback), optionally wrapped the way a repository wraps."""
    try:
        try:
            raise exc
        except BaseException as inner:
            if wrap is None:
                raise
            raise wrap("the database could not complete the operation") from inner
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(("exc", "code", "exit_code", "fix"), [
    (_raised(asyncpg.exceptions.UndefinedTableError('relation "agent_command" does not exist'),
             errors.StorageError), "not_migrated", 4, "agentledger migrate"),
    (_raised(asyncpg.exceptions.InvalidParameterValueError(
        'role "agentledger_auditor" does not exist')), "not_migrated", 4, "agentledger migrate"),
    (_raised(asyncpg.exceptions.InvalidCatalogNameError('database "nope" does not exist')),
     "no_database", 4, "AGENTLEDGER_DATABASE_URL"),
    (_raised(asyncpg.exceptions.InvalidPasswordError("password authentication failed")),
     "login_refused", 4, "AGENTLEDGER_DATABASE_URL"),
    (_raised(KafkaException(KafkaError(KafkaError._TRANSPORT))), "kafka_unreachable", 3,
     "make up"),
    (_raised(errors.NotAnOperator("user:x is not an operator")), "not_an_operator", 2, None),
])
def test_an_expected_failure_is_one_line_with_its_fix(exc: BaseException, code: str,
                                                      exit_code: int, fix: str | None) -> None:
    found = failures.classify(exc)
    assert found is not None
    assert (found.code, found.exit_code) == (code, exit_code)
    assert "\n" not in found.line()
    assert (fix is None and found.fix is None) or (fix is not None and fix in (found.fix or ""))


def test_a_setting_that_cannot_be_read_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_OPERATOR_SESSION_KEYS", "not json")
    with pytest.raises(SettingsError) as unreadable:
        operators.OperatorSettings()
    found = failures.classify(unreadable.value)
    assert found is not None and found.code == "invalid_setting" and found.exit_code == 4
    assert found.cause.startswith("AGENTLEDGER_OPERATOR_SESSION_KEYS:")


def test_an_invalid_setting_is_named_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_KAFKA_REPLICATION_FACTOR", "9")
    with pytest.raises(ValueError) as invalid:
        settings.load()
    found = failures.classify(invalid.value)
    assert found is not None and found.cause.startswith("AGENTLEDGER_KAFKA_REPLICATION_FACTOR:")


def test_an_unexpected_failure_is_left_a_traceback() -> None:
    assert failures.classify(_raised(ValueError("a bug"))) is None
    # A refused connection that no database driver raised is not called a database's.
    assert failures.classify(_raised(ConnectionRefusedError(111, "refused"))) is None


def test_the_root_group_prints_the_line_and_exits_with_its_code(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTLEDGER_OPERATOR_SESSION_KEYS", "not json")
    done = CliRunner().invoke(cli.app, ["reconcile", "resolve", "00000000-0000-0000-0000-000000000001",
                                        "--outcome", "failed", "--reason", "x", "--token", "t"])
    assert done.exit_code == 4, done.output
    assert done.output.startswith("invalid_setting: AGENTLEDGER_OPERATOR_SESSION_KEYS")
    assert len(done.output.strip().splitlines()) == 1 and "Traceback" not in done.output
    debugged = CliRunner().invoke(cli.app, ["--debug", "reconcile", "resolve",
                                            "00000000-0000-0000-0000-000000000001", "--outcome",
                                            "failed", "--reason", "x", "--token", "t"])
    assert isinstance(debugged.exception, SettingsError)  # the traceback, not the line


@pytest.mark.parametrize("args", [["--help"], ["explain", "--help"], ["demo", "--help"],
                                  ["reconcile", "resolve", "--help"],
                                  ["approvals", "approve", "--help"]])
def test_help_shows_no_type_for_a_flag(args: list[str]) -> None:
    done = CliRunner().invoke(cli.app, args, env={"COLUMNS": "160"})
    assert done.exit_code == 0, done.output
    assert "<bool>" not in done.output and "--help" in done.output


def test_the_command_is_the_first_word_that_is_not_a_root_option() -> None:
    assert cli._command(["--debug", "explain", "x", "--json"]) == "explain"
    assert cli._command(["--help"]) is None


# --------------------------------------------------------------------------- context


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTLEDGER_LOCAL_DIR", str(tmp_path))
    monkeypatch.delenv("AGENTLEDGER_DEMO_HOME", raising=False)
    context.write(tmp_path / "env", {"AGENTLEDGER_DATABASE_URL": "postgresql://h:1/agentledger",
                                     "AGENTLEDGER_KAFKA_BOOTSTRAP": "h:2",
                                     "AGENTLEDGER_PG_PORT": "1"}, why="the stack")
    keys = json.dumps({"demo-idp": "-----BEGIN PUBLIC KEY-----\nMCow\n-----END PUBLIC KEY-----\n"})
    context.write(tmp_path / "demo" / "env", {
        "AGENTLEDGER_DATABASE_URL": "postgresql://h:1/agentledger_demo",
        "AGENTLEDGER_OPERATOR_SESSION_KEYS": keys}, why="the demo")
    return tmp_path


def test_an_operator_command_reads_the_demo_then_the_stack(checkout: Path) -> None:
    environ: dict[str, str] = {"AGENTLEDGER_TOKEN": "mine"}
    read = context.load("explain", environ)
    assert read == [checkout / "demo" / "env", checkout / "env"]
    assert environ["AGENTLEDGER_DATABASE_URL"] == "postgresql://h:1/agentledger_demo"
    assert environ["AGENTLEDGER_KAFKA_BOOTSTRAP"] == "h:2" and environ["AGENTLEDGER_TOKEN"] == "mine"
    # Written and read back intact: JSON with newlines escaped, quotes and braces.
    assert json.loads(environ["AGENTLEDGER_OPERATOR_SESSION_KEYS"])["demo-idp"].startswith(
        "-----BEGIN PUBLIC KEY-----\nMCow")
    assert (checkout / "demo" / "env").stat().st_mode & 0o777 == 0o600


def test_a_stack_command_never_reads_the_demo(checkout: Path) -> None:
    environ: dict[str, str] = {}
    assert context.load("migrate", environ) == [checkout / "env"]
    assert environ["AGENTLEDGER_DATABASE_URL"] == "postgresql://h:1/agentledger"


def test_an_environment_that_names_a_ledger_reads_no_file(checkout: Path) -> None:
    environ = {"AGENTLEDGER_DATABASE_URL": "postgresql://elsewhere/x"}
    assert context.load("explain", environ) == []
    assert environ == {"AGENTLEDGER_DATABASE_URL": "postgresql://elsewhere/x"}


def test_a_value_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="AGENTLEDGER_X"):
        context.write(tmp_path / "env", {"AGENTLEDGER_X": "it's"}, why="t")
