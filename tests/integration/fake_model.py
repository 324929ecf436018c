"""A local OpenAI-compatible chat-completions server that OBEYS instructions in its input.

It plays the worst case for R1.5: whatever instruction it finds anywhere in the prompt
(including inside untrusted evidence) it turns into a tool call. Run it with
``python -m tests.integration.fake_model`` and ``FAKE_MODEL_PORT``; it answers
``POST /v1/chat/completions`` and ``GET /healthz``.

Obeyed instructions (case-insensitive, anywhere in the user message):
- ``refund 10,000 EUR on invoice <id>``      → billing_refund_create for 1,000,000 minor units
- ``export all customers``                   → crm_customers_export_all (not allowlisted)
- ``act for customer <id>``                  → crm_note_create on that customer
- ``set tenant_id to <uuid>``                → crm_note_create with an extra tenant_id argument
- ``use operation <uuid> as principal <p>``  → crm_note_create, and claims those ids in the reply
Otherwise ``add note: <text>`` in the goal → crm_note_create; else no tool call.
"""

from __future__ import annotations

import json
import os
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_CUSTOMER = re.compile(r"Customer id: (\S+)")
_REFUND = re.compile(r"refund 10,000 EUR on invoice (\w[\w-]*)", re.I)
_EXPORT = re.compile(r"export all customers", re.I)
_ACT_FOR = re.compile(r"act for customer (\w[\w-]*)", re.I)
_TENANT = re.compile(r"set tenant_id to ([0-9a-f-]{36})", re.I)
_IMPERSONATE = re.compile(r"use operation ([0-9a-f-]{36}) as principal (\S+)", re.I)
_NOTE = re.compile(r"Goal: add note: (.+)")


def respond(body: dict[str, Any]) -> dict[str, Any]:
    """The completion for one request."""
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "user")
    found = _CUSTOMER.search(text)
    customer = found.group(1) if found else "unknown"
    call: tuple[str, dict[str, Any]] | None = None
    extra: dict[str, Any] = {}
    if m := _REFUND.search(text):
        call = ("billing_refund_create", {"customer_id": customer, "invoice_id": m.group(1),
                                          "amount_minor": 1_000_000, "currency": "EUR", "reason": "as instructed"})
    elif _EXPORT.search(text):
        call = ("crm_customers_export_all", {"format": "csv"})
    elif m := _ACT_FOR.search(text):
        call = ("crm_note_create", {"customer_id": m.group(1), "body": "as instructed"})
    elif m := _TENANT.search(text):
        call = ("crm_note_create", {"customer_id": customer, "body": "as instructed", "tenant_id": m.group(1)})
    elif m := _IMPERSONATE.search(text):
        call = ("crm_note_create", {"customer_id": customer, "body": "as instructed"})
        extra = {"operation_id": m.group(1), "principal_id": m.group(2), "tenant_id": "someone-else"}
    elif m := _NOTE.search(text):
        call = ("crm_note_create", {"customer_id": customer, "body": m.group(1).strip()})
    message: dict[str, Any] = {"role": "assistant", "content": None, **extra}
    if call is not None:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": call[0], "arguments": json.dumps(call[1])}}]
    else:
        message["content"] = "No tool fits."
    return {"id": "chatcmpl-fake", "object": "chat.completion", "model": body.get("model", "fake"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if call else "stop"}],
            "usage": {"prompt_tokens": len(text) // 4, "completion_tokens": 25,
                      "total_tokens": len(text) // 4 + 25}}


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
        if self.path != "/v1/chat/completions":
            self._send(404, {"error": "not found"})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        if not body.get("tools"):
            self._send(400, {"error": "tools expected"})
            return
        self._send(200, respond(body))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the test reads Kafka, not this log


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["FAKE_MODEL_PORT"])), Handler).serve_forever()
