"""What every fake upstream shares: an aiohttp server on 127.0.0.1 in a background thread, a lock-protected
record of requests and client disconnects, start/stop and the context manager; and the ledger of bearer
tokens the OAuth-speaking fakes issue."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from aiohttp import web

__all__ = ["BackgroundServer", "TokenLedger"]


class _State(Protocol):
    disconnects: int
    requests: list[Any]


class TokenLedger:
    """Bearer tokens a fake issued: each valid until its lifetime ends or it is revoked. Not locked: the
    fakes call it with their condition held."""

    def __init__(self) -> None:
        self._expiry: dict[str, float] = {}  # token -> time.time() it expires
        self._revoked: set[str] = set()
        self.issued: list[str] = []  # oldest first

    def add(self, token: str, lifetime_s: float) -> str:
        self._expiry[token] = time.time() + lifetime_s
        self.issued.append(token)
        return token

    def status(self, token: str) -> Literal["valid", "unknown", "expired", "revoked"]:
        expires_at = self._expiry.get(token)
        if expires_at is None:
            return "unknown"
        if token in self._revoked:
            return "revoked"
        return "expired" if time.time() >= expires_at else "valid"

    def revoke_all(self) -> int:
        """Revoke every token issued so far; returns how many were live."""
        live = [t for t in self._expiry if t not in self._revoked]
        self._revoked.update(live)
        return len(live)


class BackgroundServer:
    """Subclasses define ``_dispatch(request)`` and ``_new_state()`` (an object with ``disconnects`` and
    ``requests``), and may override ``_started(host, port)`` to derive their URLs."""

    thread_name = "fake-upstream"

    def __init__(self) -> None:
        self.base_url = ""
        self.port = 0
        self.listen_port = 0  # the port to listen on, set before start (0: a free one; the --serve mode's --port)
        self._cond = threading.Condition()
        self._state: Any = self._new_state()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._stopping = False

    # -- what subclasses provide -------------------------------------------------------------

    def _new_state(self) -> _State:
        raise NotImplementedError

    _dispatch: Callable[[web.Request], Awaitable[web.StreamResponse]]

    def _started(self, host: str, port: int) -> None:
        self.port = port
        self.base_url = f"http://{host}:{port}"

    # -- public state -----------------------------------------------------------------------

    @property
    def disconnects(self) -> int:
        with self._cond:
            return int(self._state.disconnects)

    def wait_for_disconnect(self, timeout: float = 5.0, count: int = 1) -> bool:
        """Wait until at least ``count`` streams lost their client; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._state.disconnects >= count, timeout)

    def reset(self) -> None:
        """Forget recorded requests and disconnects."""
        with self._cond:
            self._state = self._new_state()

    def _record(self, req: Any) -> None:
        with self._cond:
            self._state.requests.append(req)
            self._cond.notify_all()

    def _note_disconnect(self) -> None:
        if self._stopping:
            return
        with self._cond:
            self._state.disconnects += 1
            self._cond.notify_all()

    # -- responses ------------------------------------------------------------------------------

    @staticmethod
    def _client_gone(request: web.Request) -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    @staticmethod
    def _abort(request: web.Request) -> None:
        """Drop the connection without the chunked terminator (a stream cut mid-way)."""
        transport = request.transport
        if transport is not None:
            transport.abort()

    async def _pace_json(self, request: web.Request, scenario: Any) -> bool:
        """A non-streamed answer takes as long as its stream would (``scenario.delay_before_delta`` for each
        delta). False when the client went away meanwhile (counted in ``disconnects``): answer nothing then."""
        if not scenario.paced:
            return True
        try:
            deltas = sum(e["type"] == "content_block_delta" for e in scenario.events)
            for number in range(1, deltas + 1):
                await asyncio.sleep(scenario.delay_before_delta(number))
                if self._client_gone(request):
                    raise ConnectionResetError("client went away")
        except ConnectionError:
            self._note_disconnect()
            return False
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        return True

    async def _send_sse(
        self, request: web.Request, resp: web.StreamResponse, events: Iterable[dict[str, Any]], scenario: Any
    ) -> web.StreamResponse:
        """Write the events as first-party SSE, pausing ``scenario.delay_before_delta(n)`` before the n-th delta;
        a client that goes away is counted in ``disconnects``; ``scenario.ending == "cut"`` drops the connection."""
        from .claude_api import encode_event

        paced = scenario.paced
        deltas = 0
        try:
            await resp.prepare(request)
            for event in events:
                if paced and event["type"] == "content_block_delta":
                    deltas += 1
                    await asyncio.sleep(scenario.delay_before_delta(deltas))
                if self._client_gone(request):
                    raise ConnectionResetError("client went away")
                await resp.write(encode_event(event))
        except ConnectionError:
            self._note_disconnect()
            return resp
        except asyncio.CancelledError:
            self._note_disconnect()
            raise
        if scenario.ending == "cut":
            self._abort(request)
        return resp

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._stopping = False
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=self._run_loop, args=(loop,), name=self.thread_name, daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._astart(), loop).result(timeout=10)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._stopping = True
        try:
            if self._runner is not None and loop.is_running():
                asyncio.run_coroutine_threadsafe(self._astop(), loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            self._loop = None
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @staticmethod
    def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    async def _astart(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.listen_port)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._started(host, port)

    async def _astop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
