"""The security review's findings, each as it was reproduced (a restricted key, hostile or broken upstreams on
127.0.0.1, the gateway on its own YAML), and what happens now."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.http.app import Gateway
from gateway.observability.metrics import Metrics
from gateway.settings import ConfigError, load_settings, parse_settings
from gateway.wire.errors import InvalidRequest
from gateway.wire.upstream import make_client
from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import FakeBedrock
from tests.fakes.claude_api import FakeClaudeAPI
from tests.fakes.vertex import FakeVertex

KW: dict[str, Any] = {"max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}

HOSTILE = [
    "vtx-haiku-4-5/../vtx-opus",
    "vtx-haiku-4-5/../../../../projects/other-proj/locations/global/publishers/google/models/gemini-pro:generateContent#",
    "vtx-haiku-4-5?alt=sse",
    "vtx-haiku-4-5%2F..%2Fvtx-opus",
    "vtx-haiku-4-5 x",
    "vtx-haiku-4-5\t",
    "..",
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/../x",
]


# --- 1. model names that escape their URL ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vertex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeVertex, Path]]:
    with FakeVertex() as fake:
        yield fake, fake.make_service_account(tmp_path_factory.mktemp("gcp"))


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock() as fake:
        yield fake


@pytest.fixture(scope="module")
def every_provider(
    vertex: tuple[FakeVertex, Path], bedrock: FakeBedrock, fake_claude: FakeClaudeAPI
) -> Iterator[RunningGateway]:
    fake, creds = vertex
    keys = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    yaml = f"""
auth:
  keys:
    - {{name: haiku-only, key: haiku-key, models: ["vtx-haiku-*", "brk-haiku-*", "cnv-haiku-*", "cl-haiku-*", "arn:*"]}}
providers:
  vertex: {{kind: vertex, region: us-east5, project: {fake.project}, credentials_file: "{creds}",
           base_url: "{fake.base_url}"}}
  bedrock: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", {keys}}}
  converse: {{kind: bedrock, api: converse, region: us-east-1, base_url: "{bedrock.base_url}", {keys}}}
  claude: {{kind: anthropic, api_key: k, base_url: "{fake_claude.base_url}"}}
models:
  "vtx-*": {{targets: [{{provider: vertex}}]}}
  "brk-*": {{targets: [{{provider: bedrock}}]}}
  "cnv-*": {{targets: [{{provider: converse}}]}}
  "cl-*": {{targets: [{{provider: claude}}]}}
  "arn:*": {{targets: [{{provider: bedrock}}]}}
"""
    with run_gateway(yaml) as gw:
        yield gw


@pytest.mark.parametrize("prefix", ["vtx", "brk", "cnv"])  # the adapters that put the model into a URL
@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_hostile_model_name_never_reaches_a_provider(
    every_provider: RunningGateway,
    vertex: tuple[FakeVertex, Path],
    bedrock: FakeBedrock,
    fake_claude: FakeClaudeAPI,
    prefix: str,
    hostile: str,
    path: str,
) -> None:
    """Before: a key limited to ``vtx-haiku-*`` asked for ``vtx-haiku-4-5/../vtx-opus`` and Vertex received
    ``…/models/vtx-opus:rawPredict`` with the gateway's Google token (and, with a trailing ``#``, any Vertex path
    in any project the credentials reach)."""
    model = hostile.replace("vtx-", f"{prefix}-", 1) if hostile.startswith("vtx-") else hostile
    fakes = [vertex[0], bedrock, fake_claude]
    before = [len(f.requests) for f in fakes]
    body = {"model": model, **KW} if path == "/v1/messages" else {"model": model, "messages": KW["messages"]}
    resp = httpx.post(f"{every_provider.url}{path}", json=body, headers={"x-api-key": "haiku-key"})
    if model.startswith(f"{prefix}-haiku-") or model.startswith("arn:"):  # names the key's allow-list admits
        assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error", resp.text
        assert "model" in resp.json()["error"]["message"]
    else:
        assert resp.status_code in (400, 403, 404), resp.text
    assert [len(f.requests) for f in fakes] == before  # no provider was asked anything


def test_a_model_only_in_the_body_reaches_the_provider_exactly_as_allowed(
    every_provider: RunningGateway, fake_claude: FakeClaudeAPI
) -> None:
    """The first-party API takes the model in the body, never the URL: a strange name the key's `cl-haiku-*`
    allows is sent exactly as it came (the provider refuses or serves that very name, nothing else)."""
    name = "cl-haiku-4-5/../cl-opus"
    resp = httpx.post(
        f"{every_provider.url}/v1/messages", json={"model": name, **KW}, headers={"x-api-key": "haiku-key"}
    )
    assert resp.status_code == 200 and fake_claude.requests[-1].json["model"] == name
    assert fake_claude.requests[-1].path == "/v1/messages"
    too_long = httpx.post(
        f"{every_provider.url}/v1/messages",
        json={"model": "cl-haiku-" + "x" * 300, **KW},
        headers={"x-api-key": "haiku-key"},
    )
    assert too_long.status_code == 400 and "longer than 256" in too_long.json()["error"]["message"]


def test_names_a_key_is_allowed_still_work(every_provider: RunningGateway, vertex: tuple[FakeVertex, Path]) -> None:
    resp = httpx.post(
        f"{every_provider.url}/v1/messages",
        json={"model": "vtx-haiku-fake-text@20250929", **KW},
        headers={"x-api-key": "haiku-key"},
    )
    assert resp.status_code == 200, resp.text
    assert vertex[0].requests[-1].raw_path.endswith("/models/vtx-haiku-fake-text@20250929:rawPredict")
    denied = httpx.post(
        f"{every_provider.url}/v1/messages", json={"model": "vtx-opus", **KW}, headers={"x-api-key": "haiku-key"}
    )
    assert denied.status_code == 403


def test_an_arn_is_percent_encoded_not_a_path(every_provider: RunningGateway, bedrock: FakeBedrock) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/fake-text"
    resp = httpx.post(
        f"{every_provider.url}/v1/messages", json={"model": arn, **KW}, headers={"x-api-key": "haiku-key"}
    )
    assert resp.status_code == 200, resp.text
    assert "application-inference-profile%2Ffake-text/invoke" in bedrock.requests[-1].raw_path


def test_adapters_escape_every_url_part_even_past_the_edge() -> None:
    """Defence in depth: a name that got past the edge still cannot add a segment, a query or a method."""
    from adapters.bedrock import BedrockAdapter
    from adapters.vertex import VertexAdapter
    from gateway.settings import BedrockProvider, VertexProvider

    class Tokens:
        project = "p/../q"

        async def token(self) -> str:
            return "t"

        async def refresh_after_401(self, rejected: str) -> str:
            return "t"

    vertex = VertexAdapter("v", VertexProvider(region="us-east5", base_url="http://h/v1"), None, tokens=Tokens())  # type: ignore[arg-type]
    url = vertex.url("claude-x:countTokens@2025", "rawPredict")
    assert (
        url
        == "http://h/v1/projects/p%2F..%2Fq/locations/us-east5/publishers/anthropic/models/claude-x%3AcountTokens@2025:rawPredict"
    )
    bedrock = BedrockAdapter("b", BedrockProvider(region="us-east-1", base_url="http://h", api_key="k"), None)  # type: ignore[arg-type]
    assert bedrock.url("arn:aws:bedrock:us-east-1:1:inference-profile/x", "invoke") == (
        "http://h/model/arn:aws:bedrock:us-east-1:1:inference-profile%2Fx/invoke"
    )
    for bad in ("a/../b", "a?x", "a#y", "a%2F", "..", "a b", ""):
        with pytest.raises(InvalidRequest):
            vertex.url(bad, "rawPredict")
        with pytest.raises(InvalidRequest):
            bedrock.url(bad, "invoke")
    with pytest.raises(InvalidRequest):
        bedrock.url("arn:aws:bedrock:us-east-1:1:inference-profile/../x", "invoke")


# --- 2. upstream redirects ---------------------------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = (
            b'{"id":"evil","type":"message","role":"assistant","content":[],"model":"x","stop_reason":"end_turn",'
            b'"usage":{"input_tokens":1,"output_tokens":1}}'
        )
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET = _answer

    def log_message(self, *args: Any) -> None:
        pass


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a hostile upstream whose client (the gateway) hangs up on it: what these tests want


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = _QuietServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("kind", ["anthropic", "foundry", "bedrock"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_redirect_is_an_upstream_error_and_the_key_never_leaves(status: int, kind: str, stream: bool) -> None:
    """Before: a 307 to another host sent `x-api-key: <provider key>` (Foundry: `api-key` too) there, a 302 became a
    GET that still carried it, and the other host's answer reached the client as a 200."""
    other = _serve(_Recorder)
    _Recorder.seen = []
    target = f"http://127.0.0.1:{other.server_port}/steal"

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(status)
            self.send_header("location", target)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    redirecting = _serve(Redirect)
    url = f"http://127.0.0.1:{redirecting.server_port}"
    provider = {
        "anthropic": f'{{kind: anthropic, api_key: provider-secret, base_url: "{url}"}}',
        "foundry": f'{{kind: foundry, api_key: provider-secret, base_url: "{url}/anthropic"}}',
        "bedrock": f'{{kind: bedrock, region: us-east-1, api_key: provider-secret, base_url: "{url}"}}',
    }[kind]
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers: {{p: {provider}}}
models: {{m: {{targets: [{{provider: p, model: claude-x}}]}}}}
"""
    try:
        with run_gateway(yaml) as gw:
            resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "m", "stream": stream, **KW})
            assert resp.status_code == 502 and resp.json()["error"]["type"] == "api_error"
            assert "redirect" in resp.json()["error"]["message"]
            assert gw.sample("gateway_upstream_errors_total", provider="p", error_type="api_error") == 1
        assert _Recorder.seen == []  # the other host never heard from the gateway
    finally:
        other.shutdown()
        redirecting.shutdown()


# --- 3-5. configs that turn authentication off, or kill the watcher ----------------------------------------------

BASE = """
providers: {m: {kind: mock}}
models: {m: {targets: [{provider: m}]}}
"""


@pytest.mark.parametrize(
    ("auth", "environ", "message"),
    [
        ('auth: {keys: ["${GATEWAY_API_KEY}"]}', {"GATEWAY_API_KEY": ""}, "auth.keys entry 1 is empty"),
        ('auth: {keys: ["${GATEWAY_API_KEY}"]}', {"GATEWAY_API_KEY": "   "}, "auth.keys entry 1 is empty"),
        ('auth: {keys: ["${GATEWAY_API_KEY:-}"]}', {}, "auth.keys entry 1 is empty"),
        ("auth: {keys: [{name: ci, key: ' '}]}", {}, "key 'ci' is empty"),
        ("", {}, "no auth.keys"),
        ("auth: {keys: []}", {}, "no auth.keys"),
        ("auth: {open: true, keys: [k]}", {}, "excludes auth.keys and auth.jwt"),
    ],
)
def test_an_empty_key_or_a_silent_open_gateway_is_a_config_error(
    auth: str, environ: dict[str, str], message: str
) -> None:
    """Before: ``GATEWAY_API_KEY=`` (set but empty) started with a warning and served requests without a key."""
    with pytest.raises(ConfigError, match=message):
        parse_settings(auth + BASE, source="g.yaml", environ=environ)


def test_check_config_refuses_an_empty_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    path = tmp_path / "g.yaml"
    path.write_text('auth: {keys: ["${GATEWAY_API_KEY}"]}' + BASE)
    import os

    os.environ["GATEWAY_API_KEY"] = ""
    try:
        assert main(["check-config", str(path)]) == 2
    finally:
        del os.environ["GATEWAY_API_KEY"]
    assert "empty" in capsys.readouterr().err


def reloaded(first: str, then: str, tmp_path: Path) -> tuple[bool, list[str]]:
    """A gateway on ``first``, reloaded from ``then``: whether the reload was applied, and the keys after it."""
    path = tmp_path / "g.yaml"
    path.write_text(first)

    async def go() -> tuple[bool, list[str]]:
        gw = Gateway(load_settings(path), make_client("aiohttp"), Metrics(), config_path=path)
        path.write_text(then)
        try:
            return gw.reload(), [k.name for k in gw.keys]
        finally:
            await gw.aclose()

    return asyncio.run(go())


def test_a_reload_that_loses_the_auth_section_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: a truncated file, still valid YAML but without its `auth:` section, was reloaded as a normal reload
    and the next request without a key got 200."""
    caplog.set_level(logging.WARNING)
    assert reloaded("auth: {keys: [k1]}" + BASE, BASE, tmp_path) == (False, ["key-1"])  # BASE: no auth section
    assert "config reload rejected" in caplog.text and "no auth.keys" in caplog.text


def test_a_reload_that_opens_the_gateway_on_purpose_is_applied_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert reloaded("auth: {keys: [k1]}" + BASE, "auth: {open: true}" + BASE, tmp_path) == (True, [])
    assert any(r.levelno == logging.WARNING and "opens the gateway" in r.getMessage() for r in caplog.records)


def test_the_watcher_survives_whatever_a_reload_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``max_attempts: !!int abc`` raised an uncaught ValueError, and the server ignored every later edit
    of the file for good. Bad values are ConfigErrors now (tests/unit/test_fuzz.py); and the watch loop goes on
    even when a reload raises something else."""
    from gateway import core as app_module  # where Gateway (and the loader it calls) lives

    path = tmp_path / "g.yaml"
    path.write_text("auth: {keys: [k1]}" + BASE)

    async def scenario() -> list[str]:
        gw = Gateway(load_settings(path), make_client("aiohttp"), Metrics(), config_path=path)
        real = app_module.load_settings
        calls = {"n": 0}

        def flaky(p: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("a bug in the loader")
            return real(p)

        monkeypatch.setattr(app_module, "load_settings", flaky)
        watcher = asyncio.ensure_future(gw.watch(0.01))
        await asyncio.sleep(0.05)  # the watcher has read the file's first stamp
        path.write_text("auth: {keys: [k1]}\nresilience: {retry: {max_attempts: !!int abc}}" + BASE)
        await _until(lambda: calls["n"] >= 1)
        path.write_text("auth: {keys: [k1, k2]}\n" + BASE)  # a later, good edit
        await _until(lambda: len(gw.keys) == 2)
        watcher.cancel()
        await gw.aclose()
        return [k.name for k in gw.keys]

    caplog.set_level(logging.ERROR)
    assert asyncio.run(scenario()) == ["key-1", "key-2"]
    assert "still watching" in caplog.text


async def _until(condition: Any, within_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


# --- 6-7. unbounded upstream bodies and endless events -----------------------------------------------------------

START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
    b'"model":"x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}'
    b"\n\n"
)


def _bomb(size: int) -> bytes:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    zeros = b"\0" * (4 * 1024 * 1024)
    return b"".join(packer.compress(zeros) for _ in range(size // len(zeros))) + packer.flush()


BOMB = _bomb(256 * 1024 * 1024)  # ~250 KB that inflate to 256 MiB


class Hostile(BaseHTTPRequestHandler):
    """A provider that answers each model with a different abuse."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        import json as _json

        model = _json.loads(self.rfile.read(int(self.headers["content-length"])))["model"]
        if model in ("gzip-bomb-200", "gzip-bomb-500"):
            self.send_response(200 if model.endswith("200") else 500)
            self.send_header("content-type", "application/json")
            self.send_header("content-encoding", "gzip")
            self.send_header("content-length", str(len(BOMB)))
            self.end_headers()
            self.wfile.write(BOMB)
        elif model == "html-200":
            body = b"<html><body>Welcome to the captive portal</body></html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:  # streams: one huge event, or one that never ends
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(START)
            huge = b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
            huge += b'{"type":"text","text":"' + b"a" * (20 * 1024 * 1024) + b'"}}\n\n'
            try:
                if model == "huge-event":
                    self.wfile.write(huge)
                else:
                    for _ in range(4096):  # 256 MiB at most, then give up
                        self.wfile.write(b"a" * 65536)
            except OSError:
                pass  # the gateway hung up: what this test wants

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def hostile() -> Iterator[RunningGateway]:
    server = _serve(Hostile)
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers: {{evil: {{kind: anthropic, api_key: k, base_url: "http://127.0.0.1:{server.server_port}"}}}}
models: {{"*": {{targets: [{{provider: evil}}]}}}}
"""
    try:
        with run_gateway(yaml) as gw:
            yield gw
    finally:
        server.shutdown()


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gzip-bomb-200", "with a body over 33554432 bytes"),
        ("gzip-bomb-500", "with an error body over 1048576 bytes"),
        ("html-200", "with a body that is not JSON"),
    ],
)
def test_a_json_answer_is_bounded_and_must_be_json(hostile: RunningGateway, model: str, message: str) -> None:
    """Before: a 1 MB gzip inflating to 1 GiB reached the client as a 200 of 1,073,741,824 bytes (2.1 GiB RSS), a
    gzipped 500 was inflated whole to build a 300-character message, and a 200 text/html page was returned as
    application/json."""
    before = _peak_rss_mb()
    resp = httpx.post(f"{hostile.url}/v1/messages", json={"model": model, **KW}, timeout=30)
    assert resp.status_code == 502 and resp.json()["error"]["type"] == "api_error"
    assert message in resp.json()["error"]["message"]
    assert _peak_rss_mb() - before < 120  # never the whole inflated body


@pytest.mark.parametrize("model", ["huge-event", "endless-line"])
def test_an_event_over_the_frame_limit_ends_the_stream_with_an_error(hostile: RunningGateway, model: str) -> None:
    """Before: a single 300 MiB event was passed on (1.9 GiB RSS), and a line that never ends was buffered without
    limit at quadratic cost (370 MiB in 60 s, one core at 100 %, other requests slowed to 0.3-0.6 s)."""
    import time as _time

    started = _time.monotonic()
    before = _peak_rss_mb()
    resp = httpx.post(f"{hostile.url}/v1/messages", json={"model": model, "stream": True, **KW}, timeout=60)
    assert resp.status_code == 200
    last = resp.text.rstrip().split("\n")[-1]
    assert last.startswith('data: {"type":"error","error":{"type":"api_error"') and "16777216 bytes" in last
    assert "message_stop" not in resp.text
    assert _time.monotonic() - started < 10
    assert _peak_rss_mb() - before < 150
    healthz = _time.monotonic()
    assert httpx.get(f"{hostile.url}/healthz").status_code == 200 and _time.monotonic() - healthz < 1


# --- 8. client-chosen model names as metric labels ---------------------------------------------------------------


def _series(text: str) -> set[str]:
    """The series of a /metrics text: each sample's name and labels, without its value."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_names_a_client_invents_never_become_metric_labels() -> None:
    """Before: through a glob route, 5,000 requests with unique model names grew /metrics from 176 KB to 15.7 MB
    (50,000 series). Labels are the alias and the configured upstream model only; the access line keeps the
    real name, and pricing still matches it."""
    import json as _json

    yaml = """
auth: {open: true}
providers: {m: {kind: mock, deltas: 1}}
models:
  "claude-*": {targets: [{provider: m}]}
  pinned: {targets: [{provider: m, model: claude-pinned-1}]}
pricing: {"claude-*": {input: 1000000, output: 1000000}}
"""
    with run_gateway(yaml) as gw, httpx.Client(base_url=gw.url) as http:
        http.post("/v1/messages", json={"model": "pinned", **KW})
        http.post("/v1/messages", json={"model": "claude-invented-first", **KW})
        before = _series(http.get("/metrics").text)
        for i in range(299):
            http.post("/v1/messages", json={"model": f"claude-invented-{i}", **KW})
        text = http.get("/metrics").text
        assert "claude-invented" not in text
        after = _series(text)
        # the same series by model (only their values change), not 300 times them; a few others may have appeared
        # meanwhile (the ledger's first write)
        assert {x for x in after if "model=" in x} == {x for x in before if "model=" in x}
        assert len(after) - len(before) < 10
        labels = {"alias": "claude-*", "provider": "m", "model": ""}
        assert gw.sample("gateway_requests_total", **labels, outcome="completed") == 300
        assert gw.sample("gateway_cost_usd_total", **labels) > 300  # priced by the real name, labelled by none
        assert (
            gw.sample(
                "gateway_requests_total", alias="pinned", provider="m", model="claude-pinned-1", outcome="completed"
            )
            == 1
        )
        status = _json.dumps(http.get("/v1/gateway/status").json())
        assert "claude-invented" not in status


# --- 9. huge request headers, with the default limits ----------------------------------------------------------


def test_default_header_limits_answer_431_at_once() -> None:
    """Before: 100,000 headers and a 16 MiB header were accepted; one 256 MiB header took 68 s to answer."""
    import socket as _socket
    import time as _time

    with run_gateway("auth: {open: true}" + BASE) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        for head in (
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-%d: v\r\n" % i for i in range(101)) + b"\r\n",
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (16 * 1024 * 1024) + b"\r\n\r\n",
        ):
            started = _time.monotonic()
            with _socket.create_connection((host, int(port)), timeout=10) as sock:
                with contextlib.suppress(OSError):  # refused while still sending: the answer is already there
                    sock.sendall(head)
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
            assert b"x-content-type-options: nosniff" in answer
            assert _time.monotonic() - started < 5


# --- 10. the status document and /metrics -------------------------------------------------------------------------


def test_status_is_filtered_per_key_and_metrics_need_an_admin_key() -> None:
    """Before: /v1/gateway/status showed every alias, provider and upstream model to any client key."""
    yaml = """
auth:
  keys:
    - {name: a-only, key: key-a, models: [alias-a]}
    - {name: all, key: key-all}
admin: {keys: [admin-key]}
providers: {m: {kind: mock}, secret-provider: {kind: mock}}
models:
  alias-a: {targets: [{provider: m}]}
  alias-b: {targets: [{provider: secret-provider, model: secret-model}]}
"""
    with run_gateway(yaml) as gw:

        def aliases(key: str) -> list[str]:
            resp = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": key})
            assert resp.status_code == 200
            return [a["alias"] for a in resp.json()["aliases"]]

        assert aliases("key-a") == ["alias-a"]
        a_only = httpx.get(f"{gw.url}/v1/gateway/status", headers={"x-api-key": "key-a"}).text
        assert "secret-provider" not in a_only and "secret-model" not in a_only
        assert aliases("key-all") == ["alias-a", "alias-b"]
        assert aliases("admin-key") == ["alias-a", "alias-b"]
        assert httpx.get(f"{gw.url}/v1/gateway/status").status_code == 401
        assert httpx.get(f"{gw.url}/metrics", headers={"x-api-key": "key-all"}).status_code == 401
        scrape = httpx.get(f"{gw.url}/metrics", headers={"authorization": "Bearer admin-key"})
        assert scrape.status_code == 200 and "gateway_requests_total" in scrape.text
        # an admin key is not a client key
        assert (
            httpx.post(
                f"{gw.url}/v1/messages", json={"model": "alias-a", **KW}, headers={"x-api-key": "admin-key"}
            ).status_code
            == 401
        )


# --- 11. what the upstream sends is checked ----------------------------------------------------------------------


class Sloppy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        import json as _json

        model = _json.loads(self.rfile.read(int(self.headers["content-length"])))["model"]
        self.send_response(200)
        if model == "bad-request-id":
            self.send_header("request-id", "req <script>alert(1)</script> " + "x" * 300)
            body = (
                b'{"id":"m","type":"message","role":"assistant","content":[],"model":"x","stop_reason":"end_turn",'
                b'"usage":{"input_tokens":1,"output_tokens":1}}'
            )
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        delta = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
        )
        body = (
            START
            + b'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":'
            + b'{"type":"text","text":""}}\n\n'
            + delta
            + b'"text":"caf\xc3\xa9"}}\n\n'
            + delta
            + b'"text":"\xff\xfe"}}\n\n'
        )
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_upstream_request_id_must_be_a_short_token_and_events_must_be_utf8(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: an upstream `request-id` of any content replaced the gateway's and landed in the access log, and
    invalid UTF-8 inside a `text_delta` passed through."""
    server = _serve(Sloppy)
    yaml = f"""
auth: {{open: true}}
resilience: {{retry: {{max_attempts: 1}}}}
providers: {{p: {{kind: anthropic, api_key: k, base_url: "http://127.0.0.1:{server.server_port}"}}}}
models: {{"*": {{targets: [{{provider: p}}]}}}}
"""
    caplog.set_level(logging.INFO, logger="gateway.access")
    try:
        with run_gateway(yaml) as gw:
            resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "bad-request-id", **KW})
            assert resp.status_code == 200 and resp.headers["request-id"].startswith("req_gw_")
            assert resp.headers["x-content-type-options"] == "nosniff"
            stream = httpx.post(f"{gw.url}/v1/messages", json={"model": "bad-utf8", "stream": True, **KW})
            assert "café" in stream.text  # valid UTF-8 passes
            last = stream.text.rstrip().split("\n")[-1]
            assert '"type":"error"' in last and "UTF-8" in last and b"\xff" not in stream.content
            assert gw.sample("gateway_stream_violations_total", provider="p", rule="utf8") == 1
            models = httpx.get(f"{gw.url}/v1/models")
            assert models.headers["x-content-type-options"] == "nosniff"
    finally:
        server.shutdown()
    assert "<script>" not in caplog.text


# --- 12. error messages quote internals -----------------------------------------------------------------------------


def test_errors_name_the_key_and_line_not_the_value() -> None:
    """Before: connect failures quoted the upstream host and port, a YAML error quoted its line (a literal
    secret), and validation errors printed values read from the environment."""
    with pytest.raises(ConfigError) as yaml_error:
        parse_settings(
            'auth: {open: true}\nproviders:\n  a: {kind: anthropic, api_key: "sk-literal-secret}\n',
            source="g.yaml",
            environ={},
        )
    assert "sk-literal-secret" not in str(yaml_error.value) and str(yaml_error.value).startswith("g.yaml:")
    with pytest.raises(ConfigError) as enum_error:
        parse_settings(
            'auth: {open: true}\nproviders:\n  b: {kind: bedrock, api: "${X}"}\n',
            source="g.yaml",
            environ={"X": "sk-from-the-environment"},
        )
    assert "sk-from-the-environment" not in str(enum_error.value) and "g.yaml:3" in str(enum_error.value)
    yaml = """
auth: {open: true}
resilience: {retry: {max_attempts: 1}}
providers: {dead: {kind: anthropic, api_key: k, base_url: "http://127.0.0.1:9", connect_timeout_s: 1}}
models: {"*": {targets: [{provider: dead}]}}
"""
    with run_gateway(yaml) as gw:
        resp = httpx.post(f"{gw.url}/v1/messages", json={"model": "m", **KW})
    assert resp.status_code == 502 and "127.0.0.1" not in resp.text and ":9" not in resp.text


# --- 13. duplicate top-level keys --------------------------------------------------------------------------------


def test_a_body_with_model_twice_is_refused_before_anything_is_sent(
    every_provider: RunningGateway, vertex: tuple[FakeVertex, Path]
) -> None:
    """Before: checked on one `model` and forwarded with both."""
    before = len(vertex[0].requests)
    body = b'{"model":"vtx-haiku-1","max_tokens":5,"messages":[{"role":"user","content":"x"}],"model":"vtx-opus"}'
    resp = httpx.post(
        f"{every_provider.url}/v1/messages",
        content=body,
        headers={"x-api-key": "haiku-key", "content-type": "application/json"},
    )
    assert resp.status_code == 400 and "model: given more than once" in resp.json()["error"]["message"]
    assert len(vertex[0].requests) == before
