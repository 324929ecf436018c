"""``python -m agentledger.services.crm [serve | seed ...]``: run or seed the CRM stand-in."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

import uvicorn

from agentledger.services.crm import app, models, settings, store


async def _seed(cfg: settings.Settings, args: argparse.Namespace) -> dict[str, object]:
    scopes = [models.Scope(s) for s in args.scopes.split(",") if s]
    async with store.Store.open(
        cfg.database_url, retention_seconds=cfg.idempotency_retention_seconds, max_size=1
    ) as crm:
        out: dict[str, object] = {"tenant_id": args.tenant}
        if args.customer:
            contact = models.Contact(display_name=args.name or args.customer, email=args.email,
                                     phone=args.phone)
            customer = await crm.upsert_customer(args.tenant, args.customer, contact)
            out["customer"] = customer.model_dump(mode="json")
        if scopes:
            out["token"] = await crm.issue_token(args.tenant, scopes, "cli seed")
            out["scopes"] = [s.value for s in scopes]
        return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentledger.services.crm")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("serve", help="run the HTTP service (default)")
    seed = commands.add_parser("seed", help="upsert a customer and/or issue a tenant token")
    seed.add_argument("--tenant", required=True)
    seed.add_argument("--customer", help="customer id to create or overwrite")
    seed.add_argument("--name", help="display name (default: the customer id)")
    seed.add_argument("--email")
    seed.add_argument("--phone")
    seed.add_argument("--scopes", default="read,write,lookup",
                      help="comma-separated scopes of the token to issue; empty: no token")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = settings.load()
    if args.command == "seed":
        print(json.dumps(asyncio.run(_seed(cfg, args)), indent=2))
        return 0
    # Access logs are unstructured and carry query strings; our handlers log events instead.
    uvicorn.run(app.create_app(cfg), host=cfg.host, port=cfg.port, log_config=None,
                access_log=False, lifespan="on")
    return 0


if __name__ == "__main__":
    sys.exit(main())
