"""The Postgres limit: pgbench running admission's own SQL, with no Python in the way.

The scripts are generated from ``libs/agentledger/ledger/queries.sql`` — the statements
``repository.admit`` runs — with each ``$n`` bound to a pgbench expression, so the
baseline follows the real schema and queries instead of a hand copy that drifts:

- ``seed``: the seed admission transaction, one ledger row plus its outbox row (the
  ``admit_command`` statement) in BEGIN/END, as the database owner. Its best rate over
  1, 8 and 32 clients is ``pg_limit_tps``.
- ``full``: the statements admission's transaction sends for an unbudgeted proposal
  (statement timeout and tenant binding, the principal's read, admit, read-back, audit
  event, the policy decision), as ``agentledger_admission`` under row-level security. A
  budgeted one adds the budget's open, reservation and settlement (three more statements).
  It shows how much of the gap to ``seed`` is SQL rather than Python.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from agentledger import sql

PGBENCH = os.environ.get("AGENTLEDGER_PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")
LIBS = Path(__file__).resolve().parents[1] / "libs/agentledger"
QUERIES = sql.load(LIBS / "ledger/queries.sql")
POLICY_QUERIES = sql.load(LIBS / "policy/queries.sql")
CLIENTS = (1, 8, 32)

_TENANT = "('00000000-0000-4000-8000-' || lpad(:tenant::text, 12, '0'))::uuid"
_OP = "(lpad(to_hex(:op_hi::bigint), 16, '0') || lpad(to_hex(:op_lo::bigint), 16, '0'))::uuid"
_TRACEPARENT = "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'"
# A note's payload as admission stores it: nonce + canonical JSON arguments + GCM tag.
_CIPHERTEXT = "decode(repeat('5a', 128), 'hex')"
_VARIABLES = """\\set tenant random(1, 16)
\\set op_hi random(1, 9223372036854775806)
\\set op_lo random(1, 9223372036854775806)
"""
_ADMIT_ARGS = {
    1: _TENANT, 2: _OP,
    3: "sha256(convert_to(:op_hi::text || '/' || :op_lo::text, 'UTF8'))",
    4: "'user-alice'", 5: "'crm.note.create'", 6: "'crm'", 7: "'c-bench'", 8: "NULL::text",
    9: "gen_random_uuid()", 10: "'allowlist/bench'", 11: "'bench'",
    12: "now() + interval '15 minutes'", 13: _CIPHERTEXT, 14: "1", 15: _TRACEPARENT,
    16: "NULL::text",
}
# The audit event admission writes with every admission, at its usual size. No ':' inside
# literals below: pgbench substitutes ``:name`` even inside quotes.
_AUDIT_PAYLOAD = (
    "'{\"operation_id\":\"00000000-0000-0000-0000-000000000000\",\"principal_id\":\"user-alice\","
    "\"action\":\"crm.note.create\",\"connector\":\"crm\",\"submitted_hash\":\""
    + "ab" * 32 + "\",\"recorded_hash\":\"" + "ab" * 32 + "\",\"state\":\"pending\","
    "\"decision_id\":\"00000000-0000-0000-0000-000000000000\",\"policy_version\":\"bench\","
    "\"allowlist_version\":\"bench\",\"proposal_id\":\"00000000-0000-0000-0000-000000000000\","
    "\"planner\":\"bench\",\"risk\":\"low\"}'"
)


def bind(query: str, args: dict[int, str]) -> str:
    """Replace each ``$n`` of ``query`` with ``args[n]`` (pgbench expressions, not values).

    Comment lines are dropped: pgbench substitutes ``:name`` anywhere, comments included.
    """
    body = "\n".join(line for line in query.splitlines() if not line.lstrip().startswith("--"))
    return re.sub(r"\$(\d+)", lambda m: args[int(m.group(1))], body).rstrip().rstrip(";") + ";"


def seed_script() -> str:
    """The seed admission transaction: ledger row + outbox row, one transaction."""
    return f"{_VARIABLES}BEGIN;\n{bind(QUERIES['admit_command'], _ADMIT_ARGS)}\nEND;\n"


def full_script() -> str:
    """The statements of admission's one transaction for an unbudgeted proposal."""
    statements = [
        bind(QUERIES["bind_transaction"], {1: "'5000ms'", 2: f"{_TENANT}::text"}),
        bind(POLICY_QUERIES["lookup_principal"], {1: _TENANT, 2: "'user-alice'"}),
        bind(QUERIES["admit_command"], _ADMIT_ARGS),
        bind(QUERIES["recorded_command"], {1: _TENANT, 2: _OP}),
        bind(QUERIES["append_event"], {1: _TENANT, 2: _OP, 3: "'audit'",
                                       4: "'command.admitted'", 5: _AUDIT_PAYLOAD,
                                       6: _TRACEPARENT, 7: "NULL::text"}),
        bind(POLICY_QUERIES["record_decision"], {
            1: "gen_random_uuid()", 2: _TENANT, 3: "'user-alice'", 4: "'crm.note.create'",
            5: "'c-bench'", 6: "'allow'", 7: "'cedar/bench'", 8: "'[\"policy0\"]'",
            9: "'permitted by policy0'", 10: "'admission'", 11: _OP}),
    ]
    return _VARIABLES + "BEGIN;\n" + "\n".join(statements) + "\nEND;\n"


_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)


def parse(output: str) -> tuple[float, float | None]:
    """(tps, average latency ms) from pgbench's summary."""
    tps = _TPS.search(output)
    if tps is None:
        raise RuntimeError(f"pgbench printed no tps:\n{output[-2000:]}")
    latency = _LATENCY.search(output)
    return float(tps.group(1)), float(latency.group(1)) if latency else None


def pgbench(url: str, script: str, clients: int, seconds: float, *,
            role: str | None = None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", prefix="al_bench_") as f:
        f.write(script)
        f.flush()
        env = {**os.environ}
        if role:
            env["PGOPTIONS"] = f"-c role={role}"
        # Two client threads at most: the box has two cores and the server needs them too.
        cmd = [PGBENCH, "-n", "-M", "prepared", "-f", f.name, "-c", str(clients),
               "-j", str(min(clients, 2)), "-T", str(max(1, round(seconds))), url]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    tps, latency = parse(done.stdout)
    return {"clients": clients, "tps": round(tps, 1), "latency_ms_avg": latency}


def run(url: str, seconds: float) -> dict[str, Any]:
    """pgbench both scripts at 1, 8 and 32 clients on ``url`` (a fresh migrated database)."""
    seed = [pgbench(url, seed_script(), c, seconds) for c in CLIENTS]
    full = [pgbench(url, full_script(), c, seconds, role="agentledger_admission")
            for c in CLIENTS]
    return {
        "pg_limit_tps": max(r["tps"] for r in seed),
        "pg_limit_full_tps": max(r["tps"] for r in full),
        "pgbench_seed": seed,
        "pgbench_full": full,
        "pgbench_seconds": seconds,
    }
