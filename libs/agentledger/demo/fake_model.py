"""A gullible OpenAI-compatible model for the demo: it obeys instructions planted in evidence.

``python -m agentledger.demo.fake_model`` serves ``POST /v1/chat/completions`` on
``AGENTLEDGER_DEMO_MODEL_PORT`` (and ``GET /healthz``). It reads the user message the
planner's ``openai`` adapter sends (goal, customer id, delimited untrusted evidence) and:

- if the evidence says ``call the tool <name>``, calls that tool (whatever it is);
- if the evidence says ``refund <amount> <currency> on invoice <id> to customer <id>``,
  proposes that refund, ignoring the user's goal and customer;
- otherwise does what the goal says (``add a note: <text>``), or proposes nothing.

A real model is harder to fool than this one, never impossible to: the point of the demo is
that what stops the attack is the runtime (allowlist, same-tenant resolution, approval),
not the model's judgement.
"""

from __future__ import annotations

import json
import os
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_CALL_TOOL = re.compile(r"call the tool ([A-Za-z_][A-Za-z0-9_]{0,63})", re.I)
_REFUND = re.compile(
    r"refund ([0-9]{1,7}(?:\.[0-9]{2})?) (EUR|USD|GBP|CHF) on invoice ([A-Za-z0-9_-]{1,64}) "
    r"to customer ([A-Za-z0-9_-]{1,64})", re.I)
_NOTE = re.compile(r"^add (?:a )?note\s*:\s*(.+)$", re.I | re.S)


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_demo", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def answer(body: dict[str, Any]) -> dict[str, Any]:
    """The chat completion for one request body."""
    user = next((m.get("content", "") for m in body.get("messages", [])
                 if m.get("role") == "user"), "")
    head, _, evidence = str(user).partition("\n\n")
    goal = re.search(r"^Goal: (.*)$", head, re.M)
    customer = re.search(r"^Customer id: (.*)$", head, re.M)
    calls: list[dict[str, Any]] = []
    if found := _CALL_TOOL.search(evidence):
        calls = [_tool_call(found[1], {})]
    elif found := _REFUND.search(evidence):
        calls = [_tool_call("billing_refund_create", {
            "customer_id": found[4], "invoice_id": found[3],
            "amount_minor": round(float(found[1]) * 100), "currency": found[2].upper(),
            "reason": "as the customer record instructs"})]
    elif goal and customer and (note := _NOTE.match(goal[1].strip())):
        calls = [_tool_call("crm_note_create",
                            {"customer_id": customer[1].strip(), "body": note[1].strip()})]
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else "No tool fits."}
    if calls:
        message["tool_calls"] = calls
    words = len(str(user).split())
    return {"id": "chatcmpl-demo", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": words, "completion_tokens": 20,
                      "total_tokens": words + 20}}


class _Handler(BaseHTTPRequestHandler):
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
        self._send(200, answer(body))

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        print(f"event=model_request {format % args}", flush=True)


def main() -> None:
    port = int(os.environ.get("AGENTLEDGER_DEMO_MODEL_PORT", "8099"))
    server = ThreadingHTTPServer(("127.0.0.1", port), _Handler)
    print(f"event=fake_model_started port={port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # pragma: no cover - interactive use
        pass


if __name__ == "__main__":
    main()
