"""``agentledger evidence``: the notary, its keys, receipts and their offline verification
(issue 43; docs/evidence.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from agentledger import crypto, db, errors, settings
from agentledger.cli import group
from agentledger.evidence import chain, keys, notary, receipt
from agentledger.ledger import keys as ledger_keys

app = typer.Typer(cls=group.Group, no_args_is_help=True,
                  help="Tamper-evident audit log: notary, keys, receipts, verification.")
console = Console()

DEFAULT_KEYS = settings.REPO_ROOT / ".local" / "notary" / "keys"
KeysOption = Annotated[Path, typer.Option(
    "--keys", envvar="AGENTLEDGER_NOTARY_KEYS",
    help="The notary's key directory (readable by the notary's OS user only)")]
JwksOption = Annotated[Path, typer.Option(
    "--jwks", help="The JWKS file of the notary's public keys (from `evidence jwks`)")]
Tenant = Annotated[uuid.UUID, typer.Option(help="Tenant id")]


@app.command("keygen")
def keygen(key_dir: KeysOption = DEFAULT_KEYS,
           retire: Annotated[str | None, typer.Option(
               help="Keep only the public half of this (rotated-out) key id")] = None) -> None:
    """Create a signing key and make it the active one (rotation: the old keys stay in the
    JWKS and keep verifying what they signed)."""
    if retire:
        keys.retire(key_dir, retire)
        console.print(f"retired {retire}: only its public key remains", highlight=False)
        return
    kid = keys.generate(key_dir)
    console.print(f"active signing key {kid} in {key_dir}", highlight=False)


@app.command("jwks")
def jwks(key_dir: KeysOption = DEFAULT_KEYS,
         out: Annotated[Path | None, typer.Option("-o", "--out",
                                                  help="Write here (default: stdout)")] = None,
         ) -> None:
    """Export the notary's public keys (every key, active or rotated) as a JWKS file."""
    text = json.dumps(keys.jwks(key_dir), indent=2) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text)
        console.print(f"wrote {out}", highlight=False)


@app.command("notary")
def run_notary(key_dir: KeysOption = DEFAULT_KEYS,
               interval: Annotated[float, typer.Option(help="Seconds between cycles")] = 1.0,
               once: Annotated[bool, typer.Option(
                   "--once", help="Catch up with every committed row, then stop")] = False,
               ) -> None:
    """Sequence every tenant's audit events into its log and sign checkpoints."""
    signer = keys.load_signer(key_dir)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s notary %(message)s")

    async def run() -> None:
        conn = await db.connect(settings.load().database_url, role="agentledger_notary")
        try:
            worker = notary.Notary(signer)
            if once:
                n = await notary.catch_up(conn, worker)
                console.print(f"sequenced {n} audit events; key {signer.key_id}",
                              highlight=False)
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await notary.run(conn, worker, interval_s=interval, stop=stop)
        finally:
            await conn.close()

    asyncio.run(run())


@app.command("export")
def export(operation_id: uuid.UUID, tenant: Tenant,
           out: Annotated[Path | None, typer.Option(
               "-o", "--out", help="Receipt file (default: receipt-<operation>.json)")] = None,
           with_arguments: Annotated[bool, typer.Option(
               "--with-arguments",
               help="Decrypt the command's arguments (needs AGENTLEDGER_MASTER_KEY) so the "
                    "receipt proves them against the request hash")] = False,
           ) -> None:
    """Write the receipt of one operation: its events, their inclusion proofs and the
    covering signed checkpoint, verifiable offline with `evidence verify`."""

    async def run() -> receipt.Exported:
        url = settings.load().database_url
        bound = None
        if with_arguments:
            secret = os.environ.get("AGENTLEDGER_MASTER_KEY")
            if not secret:
                raise errors.ConfigurationError("--with-arguments needs AGENTLEDGER_MASTER_KEY")
            cipher = ledger_keys.PayloadCipher(crypto.MasterKey.from_b64(secret))
            reader = await db.connect(url, role="agentledger_executor")
            try:
                bound = await receipt.bound_fields(reader, cipher, tenant, operation_id)
            finally:
                await reader.close()
        conn = await db.connect(url, role="agentledger_auditor")
        try:
            return await receipt.export(conn, tenant, operation_id, bound=bound)
        finally:
            await conn.close()

    exported = asyncio.run(run())
    path = out or Path(f"receipt-{operation_id}.json")
    path.write_bytes(exported.to_bytes())
    size = json.loads(exported.receipt["checkpoint"]["body"])["tree_size"]
    console.print(f"wrote {path}: {len(exported.receipt['leaves'])} events under the "
                  f"checkpoint of tree size {size}", highlight=False)


@app.command("verify")
def verify(file: Path, jwks_file: JwksOption) -> None:
    """Verify a receipt offline: no database, no network; only the file and the JWKS."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise errors.ConfigurationError(f"cannot read {file}") from exc
    found = receipt.verify(data, keys.load_jwks(jwks_file))
    console.print(f"[green]verified[/green]: {found.events} events of operation "
                  f"{found.operation_id} are in tenant {found.tenant_id}'s log at tree size "
                  f"{found.checkpoint.tree_size}, signed by key {found.checkpoint.key_id} at "
                  f"{found.checkpoint.time}"
                  + ("; the command's bound fields match its hash" if found.bound_checked
                     else ""), highlight=False, soft_wrap=True)


@app.command("verify-chain")
def verify_chain(tenant: Tenant, jwks_file: JwksOption) -> None:
    """Walk a tenant's log in the database; report the first broken entry."""

    async def run() -> chain.ChainReport:
        conn = await db.connect(settings.load().database_url, role="agentledger_auditor")
        try:
            return await chain.verify_chain(conn, tenant, keys.load_jwks(jwks_file))
        finally:
            await conn.close()

    found = asyncio.run(run())
    console.print(f"[green]verified[/green]: {found.entries} entries, {found.checkpoints} "
                  f"checkpoints; tree size {found.tree_size}, root {found.root_hash}; "
                  f"{found.unsequenced} newer rows not yet checkpointed", highlight=False,
                  soft_wrap=True)
