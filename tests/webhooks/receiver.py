"""A webhook receiver as a customer would write one, served from a thread of the test process.

It verifies every request the way the Standard Webhooks spec tells receivers to (HMAC-SHA256 over
``id.timestamp.body`` with the base64-decoded ``whsec_`` secret, constant-time comparison, a
5-minute timestamp window), written here independently of ``durable_assets.ops.webhooks.outbox``, and
cross-checks each request with the reference ``standardwebhooks`` library. It answers from a script
per path (e.g. 500, then 429 with Retry-After, then 200) and deduplicates on ``webhook-id``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import standardwebhooks

from tests.support.network import ServedInThread

TOLERANCE_S = 300


class Rejected(Exception):
    pass


def verify_like_a_receiver(secret: str, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """The spec's receiver algorithm, step by step (no code shared with the sender)."""
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    signature_header = headers.get("webhook-signature")
    if not (msg_id and stamp and signature_header):
        raise Rejected("missing headers")
    if abs(time.time() - int(stamp)) > TOLERANCE_S:
        raise Rejected("timestamp outside tolerance")
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{stamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
    for versioned in signature_header.split(" "):
        version, _, sig = versioned.partition(",")
        if version == "v1" and hmac.compare_digest(sig.encode(), expected):
            break
    else:
        raise Rejected("no matching signature")
    # ...and the reference implementation agrees.
    standardwebhooks.Webhook(secret).verify(body, dict(headers))
    return dict(json.loads(body))


@dataclass
class Received:
    path: str
    webhook_id: str
    timestamp: int
    payload: dict[str, Any] | None
    answered: int
    at: float
    error: str | None = None


@dataclass
class Receiver:
    secret: str
    #: path -> statuses (with optional headers) to answer, in order; then ``default``.
    script: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    default: int = 200
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, extra, payload, error = 200, {}, None, None
                try:
                    payload = verify_like_a_receiver(receiver.secret, headers, body)
                    status, extra = receiver._next(self.path)
                except Exception as exc:  # a forged or broken request: reject as a receiver would
                    status, error = 401, f"{type(exc).__name__}: {exc}"
                with receiver._lock:
                    receiver.requests.append(
                        Received(
                            path=self.path,
                            webhook_id=headers.get("webhook-id", ""),
                            timestamp=int(headers.get("webhook-timestamp", "0") or 0),
                            payload=payload,
                            answered=status,
                            at=time.monotonic(),
                            error=error,
                        )
                    )
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._served = ServedInThread(self.server)

    def _next(self, path: str) -> tuple[int, dict[str, str]]:
        with self._lock:
            queue = self.script.get(path)
            return queue.pop(0) if queue else (self.default, {})

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def on(self, path: str) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def deliveries(self, path: str = "/hook") -> dict[str, dict[str, Any]]:
        """Logical deliveries: verified and acknowledged, deduplicated on webhook-id."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.on(path):
            if r.payload is not None and 200 <= r.answered < 300:
                out.setdefault(r.webhook_id, r.payload)
        return out

    def rejected(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.error]

    def close(self) -> None:
        self._served.close()
