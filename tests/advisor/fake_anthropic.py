"""A scripted stand-in for the Anthropic Messages API on loopback.

It speaks real HTTP on 127.0.0.1 (ephemeral port) so that tests drive the real
``anthropic`` SDK end to end: its request building, retries with backoff,
timeouts, ``messages.parse`` and its structured-output validation. Each request
consumes the next scripted reply; when the script runs out the server answers
500, so a test can never hang on an unexpected extra call.

A reply with ``hang=True`` never answers on its own: the handler waits until
the server shuts down (the client's timeout or total budget must give up
first), so no test depends on how long anything takes.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_DELAY_S = 5.0
MAX_HANG_S = 120.0  # a safety net only: the server's shutdown releases a hanging handler


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: dict | str = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    echo_api_key: bool = False  # put the received x-api-key into the body (a leaky proxy)
    hang: bool = False  # accept the request and never answer (until the server shuts down)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def api_key(self) -> str | None:
        """The credential as sent: ``x-api-key``, or ``Authorization: Bearer`` (SDK 2.x)."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None


def message_body(text: str, *, input_tokens: int = 1200, output_tokens: int = 300,
                 stop_reason: str = "end_turn", model: str = "claude-sonnet-5-5") -> dict:
    """A valid Messages API response whose only content block is ``text``."""
    return {
        "id": "msg_fake0001", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
    }


def structured_body(output: dict, **kw) -> dict:
    """A Messages API response carrying ``output`` as the structured-output JSON text."""
    return message_body(json.dumps(output), **kw)


def error_body(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


class FakeAnthropic:
    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_unparsed": raw.decode(errors="replace")}
                received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with fake._lock:
                    fake.received.append(received)
                    reply = fake.script.pop(0) if fake.script else Reply(
                        500, error_body("api_error", "fake server: no scripted reply left"))
                if reply.hang:
                    fake._closing.wait(MAX_HANG_S)
                    return
                if reply.delay_s:
                    time.sleep(min(reply.delay_s, MAX_DELAY_S))
                payload = reply.body
                if reply.echo_api_key:
                    payload = error_body("api_error", f"upstream rejected key {received.api_key}")
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.send_header("request-id", f"req_fake{len(fake.received):04d}")
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeAnthropic":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
