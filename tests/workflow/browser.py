"""Headless Chromium driven over the DevTools protocol, for the MLflow UI test.

The MLflow UI is a JavaScript app: the page text exists only after its scripts ran and its REST calls
came back, so a test waits for the text it expects (polling `document.body.innerText`) instead of
sleeping. Chromium speaks the protocol over a pair of pipes (`--remote-debugging-pipe`: commands on
fd 3, replies on fd 4, one NUL-terminated JSON message each), so no port, websocket library or
driver binary is needed. The flags are the ones a container without a display, GPU or network needs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page; `goto`, `wait_for_text`, `text`, `screenshot`."""

    def __init__(self, profile_dir: Path, binary: str | None = None):
        binary = binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH (scripts/setup_system.sh installs it)")
        cmd_r, self._cmd_w = os.pipe()  # we write commands, chromium reads them on fd 3
        self._ev_r, ev_w = os.pipe()  # chromium writes replies on fd 4

        def child_fds() -> None:
            os.dup2(cmd_r, 3)
            os.dup2(ev_w, 4)

        self.log = (profile_dir.parent / "chromium.log").open("w")
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-pipe", "about:blank"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_fds,  # noqa: PLW1509 - single-threaded test process; fds 3/4 are the protocol
            close_fds=False,
        )
        os.close(cmd_r)
        os.close(ev_w)
        self._buf = b""
        self._id = 0
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self._call("Page.enable", session=True)
        self._call("Runtime.enable", session=True)

    def _send(self, method: str, params: dict[str, Any], session: bool) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self._session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _read(self, timeout: float) -> dict[str, Any]:
        import select

        deadline = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._ev_r], [], [], left)[0]:
                raise TimeoutError("chromium sent nothing in time")
            chunk = os.read(self._ev_r, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (code {self.proc.poll()})")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def _call(self, method: str, session: bool = False, timeout: float = 60, **params: Any) -> dict:
        want = self._send(method, params, session)
        while True:
            msg = self._read(timeout)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def goto(self, url: str) -> None:
        self._call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str) -> Any:
        res = self._call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        return res.get("result", {}).get("value")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def url(self) -> str:
        return self.evaluate("location.href") or ""

    def wait_for_text(self, needles: list[str], timeout: float = 120) -> str:
        """The page text once every needle is in it; TimeoutError naming the missing ones."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            missing = [n for n in needles if n not in text]
            if not missing:
                return text
            if time.monotonic() > deadline:
                page = text[:3000]
                raise TimeoutError(f"not on the page after {timeout:.0f} s: {missing}\n--- page ---\n{page}")
            time.sleep(0.5)

    def screenshot(self, path: Path) -> Path:
        data = self._call("Page.captureScreenshot", session=True, format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._send("Browser.close", {}, session=False)
            self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=20)
        finally:
            for fd in (self._cmd_w, self._ev_r):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.log.close()
