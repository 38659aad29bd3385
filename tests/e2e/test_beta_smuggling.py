"""Request smuggling through ``anthropic_beta`` (issue 31, item 1): a JSON string in a Bedrock-shaped body, or an
``anthropic-beta`` header of the Messages or Vertex-shaped routes, that is not a list of beta names is a 400 at the
edge, and nothing reaches the provider. The provider here is a keep-alive server that logs the raw bytes it
receives on each connection (the reproduction's upstream), behind each upstream client (h1, aiohttp, httpx).

And the beta policy (item 5): a client's own ``anthropic_beta`` body field never reaches a Bedrock target
(InvokeModel or Converse) — the betas sent are the ``anthropic-beta`` header's, as ``server.forward_headers``
lets it through."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway, run_gateway
from tests.fakes.bedrock import FakeBedrock

KEY = {"authorization": "Bearer client-key"}
SMUGGLE = "x\r\nX-Injected-Header: yes\r\n\r\nGET /v1/smuggled-path HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Swallow: "
BODY = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
ANSWER = json.dumps(
    {
        "id": "msg_raw",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
).encode()


class RawUpstream:
    """A keep-alive HTTP/1.1 server that answers every request it can parse with one Messages JSON answer and
    keeps every byte it received, per connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections: list[bytearray] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def raw(self) -> bytes:
        return b"".join(bytes(c) for c in self.connections)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        log = bytearray()
        self.connections.append(log)
        pending = b""
        with conn:
            while chunk := conn.recv(65536):
                log += chunk
                pending += chunk
                while b"\r\n\r\n" in pending:
                    head, _, rest = pending.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value.strip() or 0)
                    if len(rest) < length:
                        break
                    pending = rest[length:]
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nrequest-id: req_raw\r\n"
                        + f"content-length: {len(ANSWER)}\r\n\r\n".encode()
                        + ANSWER
                    )

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    server = RawUpstream()
    yield server
    server.close()


def config(port: int) -> str:
    return f"""
auth: {{keys: [{{name: attacker, key: client-key}}]}}
providers:
  claude: {{kind: anthropic, api_key: provider-secret-key, base_url: "http://127.0.0.1:{port}"}}
models:
  "*": {{targets: [{{provider: claude}}]}}
"""


CLIENTS = ["h1", "aiohttp", "httpx"]


def _raw_request(gw: RunningGateway, path: str, headers: dict[str, bytes], body: bytes) -> tuple[int, bytes]:
    """One request written byte for byte (a header value httpx would refuse or re-encode), its status and body."""
    port = int(gw.url.rsplit(":", 1)[1])
    head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}\r\n".encode()
    head += b"content-type: application/json\r\nconnection: close\r\n"
    for name, value in headers.items():
        head += name.encode() + b": " + value + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b"\r\n" + body)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status = int(raw.split(b" ", 2)[1])
    return status, raw.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("client", CLIENTS)
def test_the_reproduction_a_beta_with_crlf_in_a_bedrock_body_is_a_400_and_nothing_is_sent(
    upstream: RawUpstream, client: str
) -> None:
    with run_gateway(config(upstream.port), upstream_client=client) as gw:
        body = {**BODY, "anthropic_beta": [SMUGGLE]}
        resp = httpx.post(f"{gw.url}/model/claude-sonnet-4-6/invoke", json=body, headers=KEY, timeout=10)
        assert resp.status_code == 400, resp.text
        assert "anthropic_beta" in resp.text and "not a beta name" in resp.text
        assert upstream.raw == b""  # not one byte reached the provider
        ok = httpx.post(
            f"{gw.url}/model/claude-sonnet-4-6/invoke",
            json={**BODY, "anthropic_beta": ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"]},
            headers=KEY,
            timeout=10,
        )
        assert ok.status_code == 200, ok.text
    raw = upstream.raw
    assert raw.count(b"HTTP/1.1\r\n") == 1 and b"smuggled" not in raw and b"X-Injected" not in raw
    assert b"anthropic-beta: context-1m-2025-08-07,interleaved-thinking-2025-05-14\r\n" in raw


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("beta", ["\u20ac", "a\x00b", "x y", "a;b=1", "x" * 129, "é"])
def test_a_beta_that_is_no_name_in_a_bedrock_body_is_a_400_never_a_500(
    upstream: RawUpstream, client: str, beta: str
) -> None:
    with run_gateway(config(upstream.port), upstream_client=client) as gw:
        body = {**BODY, "anthropic_beta": ["context-1m-2025-08-07", beta]}
        resp = httpx.post(f"{gw.url}/model/claude-sonnet-4-6/invoke", json=body, headers=KEY, timeout=10)
        assert resp.status_code == 400, resp.text
        assert upstream.raw == b""


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    "path",
    [
        "/v1/messages",
        "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-6:rawPredict",
        "/model/claude-sonnet-4-6/invoke",
    ],
)
@pytest.mark.parametrize("beta", [b"x y", b"a;b=1", b"a\xc3\xa9", b"a\x7fb", b"ok-1,bad name"])
def test_an_anthropic_beta_header_that_is_no_list_of_names_is_a_400(
    upstream: RawUpstream, client: str, path: str, beta: bytes
) -> None:
    """The header, on the Messages edge and both surfaces: bytes llhttp lets through but no beta name holds."""
    body: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 10, "messages": BODY["messages"]}
    if not path.startswith("/v1/messages"):
        body = {k: v for k, v in body.items() if k != "model"}
        body["anthropic_version"] = "vertex-2023-10-16" if "rawPredict" in path else "bedrock-2023-05-31"
    with run_gateway(config(upstream.port), upstream_client=client) as gw:
        status, answer = _raw_request(
            gw, path, {"authorization": b"Bearer client-key", "anthropic-beta": beta}, json.dumps(body).encode()
        )
        assert status == 400, answer
        assert upstream.raw == b""
        status, answer = _raw_request(
            gw,
            path,
            {"authorization": b"Bearer client-key", "anthropic-beta": b"ok-1, tool_2:x"},
            json.dumps(body).encode(),
        )
        assert status == 200, answer
    assert b"anthropic-beta: ok-1, tool_2:x\r\n" in upstream.raw


def test_the_messages_edge_answers_a_bad_beta_in_the_envelope(upstream: RawUpstream) -> None:
    with run_gateway(config(upstream.port)) as gw:
        status, answer = _raw_request(
            gw,
            "/v1/messages",
            {"authorization": b"Bearer client-key", "anthropic-beta": b"a;b"},
            json.dumps({"model": "m", "max_tokens": 5, "messages": BODY["messages"]}).encode(),
        )
    assert status == 400
    error = json.loads(answer)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "anthropic-beta" in error["error"]["message"]


# --- the seam: what the edge cannot see (a provider's own header from the configuration) is never sent -------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("stream", [False, True])
def test_a_provider_header_that_is_no_one_line_is_a_500_never_sent_never_retried(
    upstream: RawUpstream, client: str, stream: bool
) -> None:
    """A provider key pasted with its line break (``api_key: "${KEY}"`` from a file ending in CRLF, or worse):
    the client gets 500 ``api_error`` in the envelope naming the header, not its value; nothing reaches the
    provider; a second request is the same 500, not a 503 of a breaker the gateway's own refusal opened."""
    cfg = config(upstream.port).replace("api_key: provider-secret-key", 'api_key: "provider-secret-key\\r\\nX-Evil: 1"')
    with run_gateway(cfg, upstream_client=client) as gw:
        for _ in range(6):
            resp = httpx.post(
                f"{gw.url}/v1/messages",
                json={"model": "claude-sonnet-4-6", "stream": stream, "max_tokens": 10, "messages": BODY["messages"]},
                headers={"x-api-key": "client-key"},
                timeout=10,
            )
            assert resp.status_code == 500, resp.text
            error = resp.json()
            assert error["type"] == "error" and error["error"]["type"] == "api_error"
            assert "x-api-key" in error["error"]["message"] and "provider-secret-key" not in resp.text
    assert upstream.raw == b""


# --- the beta policy: a client's body field never reaches Bedrock -------------------------------------------


@pytest.fixture(scope="module")
def bedrock() -> Iterator[FakeBedrock]:
    with FakeBedrock(converse_dir=Path(__file__).resolve().parents[1] / "fixtures" / "converse") as fake:
        yield fake


def bedrock_config(bedrock: FakeBedrock, forward: str) -> str:
    keys = "access_key_id: AKIDFAKEBEDROCK, secret_access_key: fake-secret"
    return f"""
auth: {{keys: [client-key]}}
server: {{forward_headers: {forward}}}
providers:
  invoke: {{kind: bedrock, region: us-east-1, base_url: "{bedrock.base_url}", {keys}}}
  converse: {{kind: bedrock, api: converse, region: us-east-1, base_url: "{bedrock.base_url}", {keys}}}
models:
  "inv-*": {{targets: [{{provider: invoke, model: anthropic.claude-sonnet-4-6}}]}}
  "cnv-*": {{targets: [{{provider: converse, model: anthropic.text}}]}}
"""


@pytest.mark.parametrize("alias", ["inv-x", "cnv-x"])
def test_a_clients_own_anthropic_beta_body_field_never_reaches_bedrock(bedrock: FakeBedrock, alias: str) -> None:
    """``forward_headers: [x-request-id]`` lets no ``anthropic-beta`` through: the betas in the body are dropped
    with it; with the default policy the header's betas are what Bedrock gets, not the body's."""
    body = {"model": alias, "max_tokens": 10, "messages": BODY["messages"], "anthropic_beta": ["evil-beta-2099-01-01"]}
    headers = {"x-api-key": "client-key", "anthropic-beta": "context-1m-2025-08-07"}
    for forward, expected in (("[x-request-id]", None), ("null", ["context-1m-2025-08-07"])):
        before = len(bedrock.requests)
        with run_gateway(bedrock_config(bedrock, forward)) as gw:
            resp = httpx.post(f"{gw.url}/v1/messages", json=body, headers=headers, timeout=10)
            assert resp.status_code == 200, resp.text
        (sent,) = bedrock.requests[before:]
        got = sent.json.get("anthropic_beta")
        if got is None and isinstance(sent.json.get("additionalModelRequestFields"), dict):
            got = sent.json["additionalModelRequestFields"].get("anthropic_beta")
        assert got == expected, sent.json
