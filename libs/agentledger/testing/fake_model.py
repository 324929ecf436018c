"""A gullible OpenAI-compatible chat-completions server: it OBEYS instructions in its input.

It plays the worst case for R1.5 (evidence is data, never authority): whatever instruction it
finds anywhere in the user message, untrusted evidence included, it turns into a tool call.
A real model is harder to fool, never impossible to: what must stop the attack is the
runtime (allowlist, same-tenant resolution, approval), not the model's judgement.

``python -m agentledger.testing.fake_model`` serves ``POST .../chat/completions`` and
``GET /healthz`` on ``FAKE_MODEL_PORT``. Obeyed instructions (case-insensitive, first match):

- ``call the tool <name>``                                   → that tool, whatever it is
- ``refund <amount> <CUR> on invoice <id> to customer <id>``  → that refund
- ``refund 10,000 EUR on invoice <id>``     → billing_refund_create for 1,000,000 minor units
- ``export all customers``                  → crm_customers_export_all (not allowlisted)
- ``act for customer <id>``                 → crm_note_create on that customer
- ``set tenant_id to <uuid>``               → crm_note_create with an extra tenant_id argument
- ``use operation <uuid> as principal <p>`` → crm_note_create, claiming those ids in the reply
- otherwise ``add note: <text>`` (or ``add a note:``) as the goal → crm_note_create;
  else no tool call.
"""

from __future__ import annotations

import json
import os
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_CUSTOMER = re.compile(r"Customer id: (\S+)")
_CALL_TOOL = re.compile(r"call the tool ([A-Za-z_][A-Za-z0-9_]{0,63})", re.I)
_REFUND_TO = re.compile(
    r"refund ([0-9]{1,7}(?:\.[0-9]{2})?) (EUR|USD|GBP|CHF) on invoice ([A-Za-z0-9_-]{1,64}) "
    r"to customer ([A-Za-z0-9_-]{1,64})", re.I)
_REFUND = re.compile(r"refund 10,000 EUR on invoice (\w[\w-]*)", re.I)
_EXPORT = re.compile(r"export all customers", re.I)
_ACT_FOR = re.compile(r"act for customer (\w[\w-]*)", re.I)
_TENANT = re.compile(r"set tenant_id to ([0-9a-f-]{36})", re.I)
_IMPERSONATE = re.compile(r"use operation ([0-9a-f-]{36}) as principal (\S+)", re.I)
_NOTE = re.compile(r"Goal: add (?:a )?note\s*:\s*(.+)", re.I)
# The answer's size only feeds token accounting; an OpenAI tool call is about this long.
COMPLETION_TOKENS = 25


def _call(text: str) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(tool, arguments, extra message fields) the first obeyed instruction asks for."""
    found = _CUSTOMER.search(text)
    customer = found.group(1) if found else "unknown"
    if m := _CALL_TOOL.search(text):
        return m.group(1), {}, {}
    if m := _REFUND_TO.search(text):
        return "billing_refund_create", {
            "customer_id": m.group(4), "invoice_id": m.group(3),
            "amount_minor": round(float(m.group(1)) * 100), "currency": m.group(2).upper(),
            "reason": "as the customer record instructs"}, {}
    if m := _REFUND.search(text):
        return "billing_refund_create", {"customer_id": customer, "invoice_id": m.group(1),
                                         "amount_minor": 1_000_000, "currency": "EUR",
                                         "reason": "as instructed"}, {}
    if _EXPORT.search(text):
        return "crm_customers_export_all", {"format": "csv"}, {}
    if m := _ACT_FOR.search(text):
        return "crm_note_create", {"customer_id": m.group(1), "body": "as instructed"}, {}
    if m := _TENANT.search(text):
        return "crm_note_create", {"customer_id": customer, "body": "as instructed",
                                   "tenant_id": m.group(1)}, {}
    if m := _IMPERSONATE.search(text):
        return "crm_note_create", {"customer_id": customer, "body": "as instructed"}, {
            "operation_id": m.group(1), "principal_id": m.group(2),
            "tenant_id": "someone-else"}
    if m := _NOTE.search(text):
        return "crm_note_create", {"customer_id": customer, "body": m.group(1).strip()}, {}
    return None


def respond(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for one request body."""
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages", [])
                     if m.get("role") == "user")
    call = _call(text)
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if call is not None:
        name, arguments, extra = call
        message.update(extra)
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(arguments)}}]
    else:
        message["content"] = "No tool fits."
    prompt = len(text) // 4
    return {"id": "chatcmpl-fake", "object": "chat.completion",
            "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if call else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": COMPLETION_TOKENS,
                      "total_tokens": prompt + COMPLETION_TOKENS}}


class Handler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send(200 if self.path == "/healthz" else 404, {"status": "ok"})

    def do_POST(self) -> None:
        if not self.path.endswith("/chat/completions"):
            self._send(404, {"error": {"message": "not found"}})
            return
        try:
            length = int(self.headers.get("content-length", "0"))
            body = json.loads(self.rfile.read(min(length, 1_000_000)))
        except ValueError:
            self._send(400, {"error": {"message": "not JSON"}})
            return
        if not body.get("tools"):
            self._send(400, {"error": {"message": "tools expected"}})
            return
        self._send(200, respond(body))

    def log_message(self, format: str, *args: Any) -> None:
        print(f"event=model_request {format % args}", flush=True)


def main() -> None:
    port = int(os.environ["FAKE_MODEL_PORT"])
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"event=fake_model_started port={port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # pragma: no cover - interactive use
        pass


if __name__ == "__main__":
    main()
