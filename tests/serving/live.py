"""A live uvicorn server on 127.0.0.1 at a free port, in a thread of the test process, stopped on exit."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serve `app`; yields its base URL once /health answers; shuts it down (lifespan included) after."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/health", timeout=1.0)
            break
        except httpx.HTTPError:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the test server did not start") from None
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
