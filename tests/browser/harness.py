"""Headless Chromium (Debian's package) through Playwright, and the local UIs it looks at.

Playwright cannot download its own browsers here, so it drives
``/usr/bin/chromium`` through ``executable_path``. Servers bind to 127.0.0.1
on a free port, run in their own process group, are waited for with a bound,
and are always killed (the whole group: ``dagster dev`` starts a webserver, a
daemon and a code server). Used by the browser tests and by
``scripts/screenshots.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

CHROMIUM = Path(os.environ.get("KERNAUDIT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def chromium(viewport: dict | None = None) -> Iterator:
    """A Playwright page in headless Chromium; yields (page, console_errors, page_errors)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True, timeout=60_000)
        try:
            page = browser.new_page(viewport=viewport or {"width": 1440, "height": 900})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@dataclass
class PageLog:
    """Console errors, uncaught exceptions and requests that left the machine."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def attach(self, page, allowed_prefixes: tuple[str, ...] = ("file://", "data:", "blob:", "about:")) -> "PageLog":
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))

        def on_dialog(dialog) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        page.on("dialog", on_dialog)

        def route(r) -> None:
            if r.request.url.startswith(allowed_prefixes):
                r.continue_()
            else:
                self.external_requests.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        return self


@dataclass
class Server:
    name: str
    url: str
    proc: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def wait_http(server: Server, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + path, timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(1.0)
    raise TimeoutError(f"{server.name} not ready after {timeout_s:.0f} s ({last}):\n{server.log_tail()}")


def stop(server: Server, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's own process group, SIGKILL after the grace period."""
    pgid = server.proc.pid  # start_new_session: the group id is the leader's pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        server.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(timeout=10)


@contextlib.contextmanager
def serve(name: str, cmd: list[str], port: int, log_dir: Path, env: dict[str, str], ready_path: str,
          ready_timeout_s: float) -> Iterator[Server]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(name=name, url=f"http://127.0.0.1:{port}", proc=proc, log_path=log_path)
    try:
        wait_http(server, ready_path, ready_timeout_s)
        yield server
    finally:
        stop(server)


def server_env(data_dir: Path, dagster_home: Path, mlflow_port: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"KERNAUDIT_DATA_DIR": str(data_dir), "DAGSTER_HOME": str(dagster_home),
                "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONUNBUFFERED": "1", "MLFLOW_ENABLE_TELEMETRY": "false"})
    if mlflow_port is not None:
        env["KERNAUDIT_MLFLOW_UI_URL"] = f"http://127.0.0.1:{mlflow_port}"
    env.pop("ANTHROPIC_API_KEY", None)
    return env


@contextlib.contextmanager
def dagster_dev(data_dir: Path, dagster_home: Path, log_dir: Path, ready_timeout_s: float = 240.0) -> Iterator[Server]:
    port = free_port()
    cmd = [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(ROOT / "workspace.yaml")]
    with serve("dagster-dev", cmd, port, log_dir, server_env(data_dir, dagster_home), "/server_info",
               ready_timeout_s) as server:
        yield server


@contextlib.contextmanager
def mlflow_ui(tracking_uri: str, artifacts: Path, log_dir: Path, ready_timeout_s: float = 180.0) -> Iterator[Server]:
    port = free_port()
    cmd = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", tracking_uri, "--default-artifact-root", artifacts.as_uri()]
    env = dict(os.environ, MLFLOW_ENABLE_TELEMETRY="false", DO_NOT_TRACK="1")
    with serve("mlflow-ui", cmd, port, log_dir, env, "/health", ready_timeout_s) as server:
        yield server
