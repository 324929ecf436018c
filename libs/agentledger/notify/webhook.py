"""The ``webhook`` notifier: a signed JSON POST per notification.

Headers a receiver checks and dedupes by:

- ``Idempotency-Key``: the notification's key, the same on every redelivery;
- ``AgentLedger-Timestamp``: seconds since the epoch when this attempt was signed;
- ``AgentLedger-Signature``: ``v1=`` + hex HMAC-SHA256 over ``timestamp + "." + body`` with the
  channel's secret (from the environment variable the channel names in ``secret_env``).

The receiver's answer is untrusted (STYLE 21) and classified in :func:`classify`: 2xx sent;
4xx other than 408 and 429 permanent; anything else (3xx, 408, 429, 5xx, a dropped
connection, a timeout) retried by the worker with backoff, a bounded number of times.
Redirects are never followed and nothing but the signature authenticates the request: no
cookies, no proxy credentials from the environment, no Authorization header to forward.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import aiohttp

from agentledger import errors
from agentledger.notify import plugins

# Long enough for a receiver that writes to a database before answering; short enough that
# a hung receiver holds a worker slot for less than the claim's lease.
DEFAULT_TIMEOUT_S: Final = 5.0
MAX_TIMEOUT_S: Final = 30.0
# Below this an HMAC key is guessable; the operator's secret must be at least this long.
MIN_SECRET_BYTES: Final = 16
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SIGNATURE_HEADER: Final = "AgentLedger-Signature"
TIMESTAMP_HEADER: Final = "AgentLedger-Timestamp"


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The signature header's value for ``body`` signed at ``timestamp``."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def classify(status: int) -> plugins.Delivery:
    """A receiver's HTTP status as a delivery outcome (the one place it is decided)."""
    if 200 <= status < 300:
        return plugins.Delivery("sent", f"HTTP {status}")
    if 400 <= status < 500 and status not in (408, 429):
        return plugins.Delivery("permanent", f"HTTP {status}: the receiver refused it")
    return plugins.Delivery("retry", f"HTTP {status}")


class WebhookNotifier:
    """POSTs each notification to the member's webhook URL, signed."""

    contact: ClassVar[plugins.ContactKind] = "webhook"

    def __init__(self, *, secret: bytes, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._secret = secret
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> WebhookNotifier:
        unknown = sorted(set(options) - {"secret_env", "timeout_s"})
        if unknown:
            raise errors.ConfigurationError(f"webhook: unknown options {unknown}")
        env = options.get("secret_env")
        if not isinstance(env, str) or not _ENV_NAME.match(env):
            raise errors.ConfigurationError(
                "webhook: secret_env must name the environment variable holding the signing "
                "secret (the secret itself is never in the file)")
        secret = os.environ.get(env, "")
        if not secret:
            raise errors.ConfigurationError(f"webhook: signing secret {env} is not set")
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise errors.ConfigurationError(
                f"webhook: signing secret {env} is shorter than {MIN_SECRET_BYTES} bytes")
        timeout = options.get("timeout_s", DEFAULT_TIMEOUT_S)
        if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                or not 0 < timeout <= MAX_TIMEOUT_S):
            raise errors.ConfigurationError(
                f"webhook: timeout_s must be a number in (0, {MAX_TIMEOUT_S}]")
        return cls(secret=secret.encode(), timeout_s=float(timeout))

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No cookie jar and no proxy settings from the environment: the request carries
            # its signature and nothing else that could authenticate it elsewhere.
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def send(self, notification: plugins.Notification) -> plugins.Delivery:
        body = json.dumps(notification.document(), sort_keys=True,
                          separators=(",", ":")).encode()
        stamp = str(int(time.time()))
        headers = {"Content-Type": "application/json", "Idempotency-Key": notification.key,
                   TIMESTAMP_HEADER: stamp,
                   SIGNATURE_HEADER: signature(self._secret, stamp, body)}
        try:
            async with self._client().post(notification.address, data=body, headers=headers,
                                           allow_redirects=False) as answer:
                return classify(answer.status)
        except Exception as exc:  # any failure of an untrusted peer is a retry
            return plugins.Delivery("retry", f"{type(exc).__name__}: no answer")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "WebhookNotifier", "classify", "signature"]
