"""One request, one runtime: a reload swaps the whole snapshot at once, a request keeps the one it started with,
a replaced runtime closes its adapters when its last request ends, and reloading happens off the event loop.
In-process (the lifecycle tests run the same through real processes)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import core as app_module  # where Gateway (and the builder it calls) lives
from gateway import runtime as runtime_module
from gateway.http.app import Gateway
from gateway.http.messages import messages_endpoint
from gateway.observability.metrics import Metrics
from gateway.settings import load_settings
from gateway.wire.upstream import make_client

BODY = json.dumps({"model": "a", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).encode()


def config(path: Path, key: str, provider: str) -> None:
    path.write_text(
        f"auth: {{keys: [{key}]}}\n"
        f"providers: {{{provider}: {{kind: mock, deltas: 1}}}}\n"
        f"models: {{a: {{targets: [{{provider: {provider}}}]}}}}\n"
    )


async def gateway(path: Path) -> Gateway:
    return Gateway(load_settings(path), make_client("aiohttp"), Metrics(), config_path=path)


def scope(key: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/messages",
        "query_string": b"",
        "headers": [(b"x-api-key", key.encode()), (b"content-type", b"application/json")],
    }


def test_a_request_keeps_the_runtime_it_started_with(tmp_path: Path) -> None:
    """Before: the key was checked against the table current before the body was read, the route resolved on the
    one current after it: a reload in between served one request with two configs."""
    path = tmp_path / "g.yaml"
    config(path, "old-key", "old-provider")

    async def go() -> tuple[int, dict[str, str]]:
        gw = await gateway(path)
        body_ready = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            await body_ready.wait()  # the body is slow: the reload happens while the request waits for it
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        request = asyncio.ensure_future(messages_endpoint(gw, scope("old-key"), receive, send))
        await asyncio.sleep(0.01)
        config(path, "new-key", "new-provider")
        assert gw.reload() is True
        body_ready.set()
        await request
        await gw.aclose()
        start = sent[0]
        return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}

    status, headers = asyncio.run(go())
    assert status == 200  # the old key was valid for the old config, and the old config served it
    assert headers["x-gateway-provider"] == "old-provider"


class Closing:
    """An adapter stand-in that records its close."""

    closed: list[str] = []

    def __init__(self, name: str) -> None:
        self.name = name

    async def aclose(self) -> None:
        Closing.closed.append(self.name)


def test_a_replaced_runtime_closes_its_adapters_when_its_last_request_ends(tmp_path: Path) -> None:
    """Before: every reload kept the old adapter table until shutdown (51 retained after 51 reloads)."""
    path = tmp_path / "g.yaml"
    config(path, "k", "p")

    async def go() -> None:
        gw = await gateway(path)
        first = gw.runtime
        first.adapters["p"] = Closing("first")  # type: ignore[assignment]
        first.enter()  # a request still running on it
        for i in range(5):
            assert gw.reload() is True
            gw.runtime.adapters["p"] = Closing(f"reload-{i}")  # type: ignore[assignment]
        await asyncio.sleep(0.01)
        assert "first" not in Closing.closed  # still in use
        assert Closing.closed == [f"reload-{i}" for i in range(4)]  # the idle ones went at once
        first.leave()  # its last request ends
        await first.closed()
        assert "first" in Closing.closed
        assert not gw._retired  # nothing piles up: each is forgotten once closed
        await gw.aclose()
        assert "reload-4" in Closing.closed

    Closing.closed = []
    asyncio.run(go())


def test_reloading_builds_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: reload() ran on the loop (18.9 ms with five Bedrock providers without a region)."""
    path = tmp_path / "g.yaml"
    config(path, "k", "p")
    real = runtime_module.build_runtime

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # a blocking build (botocore sessions)
        return real(*args, **kwargs)

    async def go() -> int:
        gw = await gateway(path)
        monkeypatch.setattr(app_module, "build_runtime", slow)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        config(path, "k2", "p")
        assert await gw.reload_async() is True
        tick.cancel()
        assert [k.name for k in gw.keys] == ["key-1"] and gw.reloads == 1
        await gw.aclose()
        return ticks

    assert asyncio.run(go()) >= 10  # the loop kept running while the runtime was built


def test_sighup_reloads_off_the_loop_and_keeps_a_reference(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    config(path, "k", "p")

    async def go() -> int:
        gw = await gateway(path)
        config(path, "k2", "p")
        gw.reload_soon()
        assert len(gw._tasks) == 1
        await asyncio.gather(*gw._tasks)
        await gw.aclose()
        return gw.reloads

    assert asyncio.run(go()) == 1


def test_the_drain_ends_a_stream_still_running_with_an_error(tmp_path: Path) -> None:
    """SIGTERM's drain, in-process: a stream still running after the drain timeout ends with one `error` event
    (overloaded_error: retry), its usage recorded as a timeout; a request arriving before it finishes normally."""
    path = tmp_path / "g.yaml"
    path.write_text(
        "auth: {keys: [k]}\n"
        "providers: {slow: {kind: mock, deltas: 50, event_delay_ms: 20}}\n"
        "models: {a: {targets: [{provider: slow}]}}\n"
    )
    body = json.dumps({"model": "a", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]})

    async def go() -> tuple[list[dict[str, Any]], Gateway]:
        gw = await gateway(path)
        sent: list[dict[str, Any]] = []
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body.encode(), "more_body": False}
            await asyncio.sleep(3600)  # the client stays
            return {"type": "http.disconnect"}

        streaming = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body":
                streaming.set()  # the stream is in flight

        request = asyncio.ensure_future(messages_endpoint(gw, scope("k"), receive, send))
        await asyncio.wait_for(streaming.wait(), 5)
        assert gw.streams
        gw.begin_drain(timeout=0.1)
        await asyncio.wait_for(request, 5)
        await gw.aclose()
        return sent, gw

    sent, gw = asyncio.run(go())
    kinds = [m["type"] for m in sent]
    assert kinds.count("http.response.start") == 1 and sent[-1]["more_body"] is False
    assert b'"type":"overloaded_error"' in sent[-1]["body"] and b"message_stop" not in b"".join(
        m.get("body", b"") for m in sent
    )
    assert (
        gw.metrics.registry.get_sample_value(
            "gateway_requests_total", {"alias": "a", "provider": "slow", "model": "", "outcome": "timeout"}
        )
        == 1
    )
    assert not gw.streams


def test_a_reload_outside_the_event_loop_closes_the_old_runtime_at_shutdown(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    config(path, "k", "p")
    gw = asyncio.run(gateway(path))
    first = gw.runtime
    first.adapters["p"] = Closing("outside")  # type: ignore[assignment]
    Closing.closed = []
    config(path, "k2", "p")
    assert gw.reload() is True  # no running loop here: the old runtime cannot schedule its close
    assert Closing.closed == []
    asyncio.run(gw.aclose())
    assert Closing.closed == ["outside"]
