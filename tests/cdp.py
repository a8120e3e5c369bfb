"""A tiny Chrome DevTools Protocol client over ``--remote-debugging-pipe`` (no websocket, no
downloads): drives the system's headless Chromium for the serving page's browser test."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from typing import Any


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Headless Chromium whose CDP messages travel on fds 3 (in) and 4 (out), NUL-separated."""

    def __init__(self, executable: str, profile_dir: str, timeout: float = 60.0) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def wire() -> None:  # in the child: the pipes become fds 3 and 4 (dup2 leaves them inheritable)
            import fcntl

            r, w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child_r, from_child_w))  # out of the way
            os.dup2(r, 3)
            os.dup2(w, 4)

        args = [executable, "--headless", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
                "--force-device-scale-factor=1", f"--user-data-dir={profile_dir}", "about:blank"]
        self.proc = subprocess.Popen(args, preexec_fn=wire, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, close_fds=False)  # fds 3, 4 must survive
        os.close(to_child_r)
        os.close(from_child_w)
        self.timeout = timeout
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            import select

            ready, _, _ = select.select([self._from_child], [], [], max(0.0, deadline - time.monotonic()))
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the debugging pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method and (session is None or event.get("sessionId") == session):
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
