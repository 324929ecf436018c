"""``agentledger approvals list|show|approve|deny|narrow``: the console's JSON API from a
terminal.

The CLI holds no database credentials: it speaks to the approvals console with the
approver's own session token (``--token`` or ``AGENTLEDGER_TOKEN``), so the tenant, the
approver and the policy checks are exactly the console's. Approving sends the hash of the
request the approver was shown; a request that changed in between is not approved.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from agentledger.cli import group

app = typer.Typer(cls=group.Group, no_args_is_help=True,
                  help="Review and decide pending approval requests.")
console = Console()

# The console reads the current record from the CRM while answering; a few seconds cover it.
TIMEOUT_S = 15.0

Url = Annotated[str, typer.Option("--url", envvar="AGENTLEDGER_CONSOLE_URL",
                                  help="The approvals console's base URL")]
TokenOpt = Annotated[str, typer.Option("--token", envvar="AGENTLEDGER_TOKEN", show_default=False,
                                       help="Your session token (default: $AGENTLEDGER_TOKEN)")]
DEFAULT_URL = "http://127.0.0.1:8070"


def _call(url: str, token: str, method: str, path: str, body: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    try:
        response = httpx.request(method, f"{url.rstrip('/')}/api/v1{path}", json=body,
                                 headers={"Authorization": f"Bearer {token}"},
                                 timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        console.print(f"[red]the console at {url} did not answer[/red]: {type(exc).__name__}")
        raise typer.Exit(3) from exc
    try:
        data = response.json()
    except ValueError:
        data = {}
    if response.status_code >= 400:
        error = data.get("error", {}) if isinstance(data, dict) else {}
        console.print(f"[red]{response.status_code} {escape(str(error.get('code', 'error')))}"
                      f"[/red]: {escape(str(error.get('message', response.text[:200])))}",
                      highlight=False)
        raise typer.Exit(2)
    return data if isinstance(data, dict) else {}


def _left(seconds: int) -> str:
    if seconds <= 0:
        return "expired"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min" if minutes else f"{seconds} s"


@app.command("list")
def list_(
    url: Url = DEFAULT_URL, token: TokenOpt = "",
    state: Annotated[str, typer.Option(help="pending, approved, denied, expired, superseded, "
                                            "narrowed")]
    = "pending",
) -> None:
    """List your tenant's approval requests (pending by default)."""
    data = _call(url, _token(token), "GET", f"/approvals?state={state}")
    rows = data.get("approvals", [])
    if not rows:
        console.print(f"no {data.get('state', state)} approval requests")
        return
    table = Table(title=Text(f"{data.get('state', state)} approvals · "
                             f"tenant {data.get('tenant_id')}"))
    for column in ("approval id", "action", "target", "requested by", "risk", "time left"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(*(Text(str(v)) for v in (
            r["approval_id"], r["action"], r["target"], r["principal"], r["risk"],
            _left(int(r["seconds_left"])) if r["state"] == "pending" else r["state"])))
    console.print(table)


# What a terminal executes or reorders rather than shows: C0 controls but newline and tab,
# DEL, C1 controls, bidirectional overrides and isolates. Evidence is untrusted text: an escape
# sequence in it could move the cursor and overwrite the amount an approver reads.
_NOT_SHOWN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _inert(value: Any) -> Any:
    """``value`` (JSON-like) with every string made showable: ``\\uXXXX`` for what is not."""
    if isinstance(value, str):
        return _NOT_SHOWN.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    if isinstance(value, dict):
        return {_inert(k): _inert(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_inert(v) for v in value]
    return value


def _show(r: dict[str, Any]) -> None:
    # Everything from the request is data: made inert, and escaped so rich markup in it prints
    # as text.
    r = _inert(r)
    console.print(f"[bold]{escape(r['action'])}[/bold] on [bold]{escape(r['target'])}[/bold]  "
                  f"state [bold]{r['state']}[/bold]  requested by {escape(r['principal'])}  "
                  f"risk {r['risk']}  time left {_left(int(r['seconds_left']))}", highlight=False)
    current = r.get("current") or {}
    if current.get("changed_since_proposal"):
        console.print("[red]the record changed since the proposal: approving supersedes it[/red]")
    if r.get("changes"):
        diff = Table(title=Text(f"change against the current record "
                                f"(revision {current.get('revision')})"))
        for column in ("field", "current", "proposed"):
            diff.add_column(column, overflow="fold")
        for c in r["changes"]:
            mark = "" if c["changed"] else " (unchanged)"
            diff.add_row(Text(str(c["field"])), Text(str(c["before"])),
                         Text(f"{c['after']}{mark}"))
        console.print(diff)
    # Untrusted evidence first: what the approver decides on (arguments, hash) comes last.
    for e in r.get("evidence", []):
        console.print(f"[yellow]UNTRUSTED evidence {escape(str(e.get('ref')))}[/yellow] from "
                      f"{escape(str(e.get('source')))}:", highlight=False)
        console.print(str(e.get("excerpt", "")), markup=False, highlight=False)
    console.print("proposed arguments:")
    console.print(json.dumps(r.get("arguments"), indent=2, ensure_ascii=False), markup=False,
                  highlight=False)
    console.print(f"request hash   {r['request_hash']}\npolicy version {r['policy_version']}",
                  highlight=False)


@app.command()
def show(approval_id: str, url: Url = DEFAULT_URL, token: TokenOpt = "") -> None:
    """Show one request: the change against the current record, arguments, evidence, hash."""
    _show(_call(url, _token(token), "GET", f"/approvals/{approval_id}"))


def _decide(verb: str, approval_id: str, url: str, token: str, shown: str | None, reason: str,
            yes: bool) -> None:
    token = _token(token)
    if shown is None:
        # Show the request, then send the hash of exactly what was shown.
        request = _call(url, token, "GET", f"/approvals/{approval_id}")
        _show(request)
        shown = str(request["request_hash"])
        if not yes and not typer.confirm(f"{verb} this request?"):
            raise typer.Exit(1)
    result = _call(url, token, "POST", f"/approvals/{approval_id}/{verb}",
                   {"shown_hash": shown, "reason": reason})
    console.print(f"[bold]{escape(str(result['state']))}[/bold]: "
                  f"{escape(str(result.get('message', '')))}", highlight=False)


HashOpt = Annotated[str | None, typer.Option(
    "--hash", help="The request hash you reviewed; without it the request is shown first")]
ReasonOpt = Annotated[str, typer.Option(help="Why (recorded with the decision)")]
YesOpt = Annotated[bool, typer.Option("--yes", help="Do not ask after showing the request")]


@app.command()
def approve(approval_id: str, url: Url = DEFAULT_URL, token: TokenOpt = "",
            shown_hash: HashOpt = None, reason: ReasonOpt = "", yes: YesOpt = False) -> None:
    """Approve a request: admits exactly the command whose hash you reviewed."""
    _decide("approve", approval_id, url, token, shown_hash, reason, yes)


@app.command()
def deny(approval_id: str, url: Url = DEFAULT_URL, token: TokenOpt = "",
         shown_hash: HashOpt = None, reason: ReasonOpt = "", yes: YesOpt = False) -> None:
    """Deny a request: nothing is executed."""
    _decide("deny", approval_id, url, token, shown_hash, reason, yes)


SetOpt = Annotated[list[str], typer.Option(
    "--set", help="FIELD=VALUE, the narrowed value as JSON (e.g. amount_minor=40000, "
                  "recipients='[\"a@example.com\"]'); repeat for several fields")]


def _narrowed(arguments: dict[str, Any], sets: list[str]) -> dict[str, Any]:
    out = dict(arguments)
    for item in sets:
        field, sep, raw = item.partition("=")
        if not sep or not field:
            console.print(f"[red]--set {escape(item[:80])}[/red]: expected FIELD=VALUE")
            raise typer.Exit(2)
        try:
            out[field] = json.loads(raw)
        except ValueError:
            out[field] = raw  # a bare string
    return out


@app.command()
def narrow(approval_id: str, sets: SetOpt, url: Url = DEFAULT_URL, token: TokenOpt = "",
           reason: ReasonOpt = "", yes: YesOpt = False) -> None:
    """Narrow a request (a lower amount, fewer recipients) and approve the narrowed one.

    Only the fields the action declares narrowable may change, and only narrower; the
    narrowed request gets its own hash and replaces this one, which never runs.
    """
    token = _token(token)
    request = _call(url, token, "GET", f"/approvals/{approval_id}")
    _show(request)
    arguments = _narrowed(dict(request.get("arguments") or {}), sets)
    console.print("narrowed arguments:")
    console.print(json.dumps(_inert(arguments), indent=2, ensure_ascii=False), markup=False,
                  highlight=False)
    if not yes and not typer.confirm("Narrow this request and approve the narrowed one?"):
        raise typer.Exit(1)
    result = _call(url, token, "POST", f"/approvals/{approval_id}/narrow",
                   {"shown_hash": str(request["request_hash"]), "arguments": arguments,
                    "reason": reason})
    narrowed = result.get("narrowed") or {}
    console.print(f"[bold]{escape(str(result.get('state')))}[/bold]: narrowed request "
                  f"{escape(str(narrowed.get('approval_id')))} is "
                  f"[bold]{escape(str(narrowed.get('state')))}[/bold] "
                  f"(hash {escape(str(narrowed.get('request_hash')))}). "
                  f"{escape(str(result.get('message', '')))}", highlight=False)


def _token(token: str) -> str:
    if not token:
        console.print("[red]no session token[/red]: pass --token or set AGENTLEDGER_TOKEN")
        raise typer.Exit(2)
    return token
