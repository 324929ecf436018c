"""Fault injection for tests and the demo, mounted only when ``faults_enabled`` is true.

Rules are set with ``POST /admin/faults`` and live in this process's memory. Each rule
matches requests by method and path prefix and fires on the next ``times`` of them
(``null``: every one) with one action:

- ``delay``: wait ``delay_ms``, then handle the request normally;
- ``fail_before_commit``: do the work, roll it back just before commit, answer 503;
- ``drop_after_commit``: commit, then close the connection without any HTTP response
  (the client sees a transport error, never a status code);
- ``late_answer_after_commit``: commit, then hold the response for ``delay_ms``
  (past the client's timeout, if it is shorter).

A rule is used up when it matches, even if the request then fails for its own reasons.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StringConstraints
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentledger.services.crm import errors

log = logging.getLogger(__name__)

_FAIL_FLAG = "crm_fail_before_commit"


class Action(StrEnum):
    DELAY = "delay"
    FAIL_BEFORE_COMMIT = "fail_before_commit"
    DROP_AFTER_COMMIT = "drop_after_commit"
    LATE_ANSWER_AFTER_COMMIT = "late_answer_after_commit"


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    method: Literal["GET", "POST", "PATCH", "PUT", "DELETE"] | None = None
    path_prefix: Annotated[str, StringConstraints(pattern=r"^/", max_length=200)] = "/"


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    match: Match
    # FastAPI validates decoded JSON in Python mode, where a strict enum wants an instance.
    action: Annotated[Action, Strict(False)]
    times: Annotated[int, Field(ge=1, le=10_000)] | None = 1
    # Two minutes is longer than any client timeout a test sets, and short enough that a
    # forgotten rule does not pin a request for the life of the process.
    delay_ms: Annotated[int, Field(ge=0, le=120_000)] = 0

    def matches(self, method: str, path: str) -> bool:
        return (self.match.method in (None, method)) and path.startswith(self.match.path_prefix)


@dataclass
class _Armed:
    rule: Rule
    remaining: int | None


class Faults:
    """The armed rules; the first matching rule fires."""

    def __init__(self) -> None:
        # Touched only from the event loop, and never across an await: no lock needed.
        self._armed: list[_Armed] = []

    def add(self, rule: Rule) -> None:
        self._armed.append(_Armed(rule, rule.times))

    def clear(self) -> None:
        self._armed.clear()

    def armed(self) -> list[Rule]:
        return [a.rule.model_copy(update={"times": a.remaining}) for a in self._armed]

    def take(self, method: str, path: str) -> Rule | None:
        """The rule firing for this request, counting one use of it."""
        for armed in self._armed:
            if armed.rule.matches(method, path):
                if armed.remaining is not None:
                    armed.remaining -= 1
                    if armed.remaining == 0:
                        self._armed.remove(armed)
                return armed.rule
        return None


def failing(request: Request) -> bool:
    """Whether a ``fail_before_commit`` rule fired for this request."""
    return bool(getattr(request.state, _FAIL_FLAG, False))


def before_commit(request: Request) -> None:
    """Called by a mutating handler as the last step inside its transaction."""
    if failing(request):
        raise errors.FaultInjected()


class Middleware:
    """Raw ASGI middleware; must be the outermost layer so it holds the server's ``send``."""

    def __init__(self, app: ASGIApp, faults: Faults) -> None:
        self.app = app
        self.faults = faults

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rule = None
        if scope["type"] == "http":
            rule = self.faults.take(scope["method"], scope["path"])
        if rule is None:
            await self.app(scope, receive, send)
            return
        log.info("event=fault_fired action=%s method=%s path=%s",
                 rule.action.value, scope["method"], scope["path"])
        if rule.action is Action.DELAY:
            await asyncio.sleep(rule.delay_ms / 1000)
            await self.app(scope, receive, send)
        elif rule.action is Action.FAIL_BEFORE_COMMIT:
            scope.setdefault("state", {})[_FAIL_FLAG] = True
            await self.app(scope, receive, send)
        elif rule.action is Action.DROP_AFTER_COMMIT:
            await self._drop(scope, receive, send)
        else:
            await self._late(rule.delay_ms / 1000, scope, receive, send)

    async def _drop(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def swallow(message: Message) -> None:
            return None

        # The handler returns only after its transaction committed (or failed).
        await self.app(scope, receive, swallow)
        # uvicorn's ``send`` is a method of the request cycle, which holds the socket.
        transport = getattr(getattr(send, "__self__", None), "transport", None)
        if isinstance(transport, asyncio.Transport):
            transport.abort()
            # Wait for the server to see the loss; otherwise it would answer 500 for us.
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        # A server that hides its transport: start a response and never finish it.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ConnectionAbortedError("fault injection: response dropped after commit")

    async def _late(self, delay: float, scope: Scope, receive: Receive, send: Send) -> None:
        async def late_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                await asyncio.sleep(delay)
            await send(message)

        await self.app(scope, receive, late_send)
