"""A real headless Chromium driven through the Chrome DevTools Protocol over a pipe, for the
tests of pages the project serves.

Chromium's ``--remote-debugging-pipe`` reads protocol messages (JSON, each ended by a NUL byte)
from file descriptor 3 and writes its answers and events to descriptor 4, so no port, no
WebSocket library and no driver binary is needed: the protocol is Chromium's own, and this
module only frames its messages. ``Chromium.find()`` is Debian's ``chromium`` (or the
``VASWANI_CHROMIUM`` executable); the tests skip, saying so, where there is none.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

#: The flags this machine's Chromium needs: headless, no sandbox (root in a container), no GPU,
#: and nothing that reaches the (closed) network.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1000,1000"]


class BrowserError(AssertionError):
    """Chromium answered a command with an error, or did not answer in time."""


class Chromium:
    """One headless Chromium process and one page in it."""

    @staticmethod
    def find() -> str | None:
        return os.environ.get("VASWANI_CHROMIUM") or shutil.which("chromium") \
            or shutil.which("chromium-browser")

    def __init__(self, executable: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="vaswani-chromium-")
        to_browser, self._write = os.pipe()
        self._read, from_browser = os.pipe()
        # kept above 4 so that placing them at 3 and 4 in the child cannot overwrite each other
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_browser, from_browser)]
        for fd in (to_browser, from_browser):
            os.close(fd)

        def place_pipes() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.process = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=place_pipes, pass_fds=(3, 4),
        )
        for fd in high:
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.send("Page.enable", session=True)
        self.send("Runtime.enable", session=True)

    # -- the protocol ---------------------------------------------------------------------------

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise BrowserError("Chromium did not answer in time")
            if self.process.poll() is not None:
                raise BrowserError(f"Chromium exited ({self.process.returncode}): "
                                   f"{self.process.stderr.read().decode(errors='replace')[-2000:]}")
            readable, _, _ = select.select([self._read], [], [], 0.5)
            if not readable:
                continue
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise BrowserError("Chromium closed its protocol pipe")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, session: bool = False, **params) -> dict:
        """Send one command (to the page when ``session``) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            answer = self._message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_event(self, method: str) -> dict:
        """The next event ``method`` (one already received counts)."""
        deadline = time.monotonic() + self.timeout
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            self.events.append(self._message(deadline))

    # -- the page -------------------------------------------------------------------------------

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self.events.clear()
        self.send("Page.navigate", session=True, url=url)
        self.wait_event("Page.loadEventFired")

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", session=True, expression=expression,
                           awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"still false after waiting: {expression}")
            time.sleep(0.1)

    def type_into(self, selector: str, text: str) -> None:
        """Replace the content of a text field as a person does: focus, select all, type."""
        self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                      " e.focus(); e.select(); })()")
        self.send("Input.insertText", session=True, text=text)

    def click(self, selector: str) -> None:
        """A real mouse click at the middle of an element."""
        box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                            ".getBoundingClientRect(); return [r.x + r.width / 2,"
                            " r.y + r.height / 2]; })()")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", session=True, type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def screenshot(self) -> bytes:
        """The whole page as PNG."""
        data = self.send("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True)["data"]
        return base64.b64decode(data)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
