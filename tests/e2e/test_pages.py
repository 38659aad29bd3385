"""The browser pages as HTTP resources (the browser tests in tests/browser drive them): served from the
package with a strict content security policy, nothing outside gateway/http/web reachable, switched off with
``server.ui: false``; and the status document's totals read from the metrics registry."""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import RunningGateway, claude_config, run_gateway
from tests.fakes.claude_api import FakeClaudeAPI, final_message

ROOT = Path(__file__).resolve().parents[2]
MOCK = """
auth: {keys: [k1]}
providers: {demo: {kind: mock}}
models: {claude-x: {targets: [{provider: demo}]}}
"""


@pytest.fixture(scope="module")
def mock_gateway() -> Iterator[RunningGateway]:
    with run_gateway(MOCK) as gw:
        yield gw


@pytest.mark.parametrize(
    ("path", "content_type", "marker"),
    [
        ("/playground", "text/html", b'<script type="module" src="/ui/playground.js">'),
        ("/status", "text/html", b'<script type="module" src="/ui/status.js">'),
        ("/ui/fold.js", "text/javascript", b"export function foldEvent"),
        ("/ui/playground.js", "text/javascript", b'from "./fold.js"'),
        ("/ui/style.css", "text/css", b":root"),
    ],
)
def test_pages_and_assets_are_served_without_a_key(
    mock_gateway: RunningGateway, path: str, content_type: str, marker: bytes
) -> None:
    resp = httpx.get(mock_gateway.url + path)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == f"{content_type}; charset=utf-8"
    assert marker in resp.content
    csp = resp.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_html_has_no_inline_script_or_style() -> None:
    for page in (ROOT / "gateway" / "http" / "web").glob("*.html"):
        html = page.read_text()
        assert "<script>" not in html and "<style" not in html and " style=" not in html and "onclick" not in html


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/..%2Fpages.py", "/ui/%2E%2E%2Fapp.py", "/ui/", "/ui/fold.JS"])
def test_nothing_else_is_reachable(mock_gateway: RunningGateway, path: str) -> None:
    resp = httpx.get(mock_gateway.url + path)
    assert resp.status_code == 404
    assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "not_found_error"


def test_ui_false_turns_the_pages_off_but_not_the_api() -> None:
    with run_gateway(MOCK.replace("auth:", "server: {ui: false}\nauth:")) as gw:
        for path in ("/playground", "/status", "/ui/fold.js"):
            resp = httpx.get(gw.url + path)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["type"] == "not_found_error"
        assert httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "k1"}).status_code == 200


def test_package_data_ships_every_web_file() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "gateway.http"
    ]
    files = [p.relative_to(ROOT / "gateway" / "http").as_posix() for p in (ROOT / "gateway" / "http" / "web").iterdir()]
    assert files
    for name in files:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_status_totals_equal_the_metrics(fake_claude: FakeClaudeAPI, tmp_path: Path) -> None:
    """The gateway-wide totals (an admin key's scope) equal the metrics; a client key's scope is its own usage
    (its own ledger: the default file is shared by every gateway of the test process)."""
    extra = f'admin: {{keys: [gw-admin]}}\nstore: {{url: "sqlite:///{tmp_path}/ledger.db"}}\n'
    with run_gateway(claude_config(fake_claude.base_url) + extra) as gw:
        key = {"x-api-key": "gw-key-1"}
        for _ in range(2):
            body = {
                "model": "sonnet",
                "max_tokens": 10,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
            assert httpx.post(gw.url + "/v1/messages", json=body, headers=key).status_code == 200
        bad = httpx.post(gw.url + "/v1/messages", json={**body, "model": "mock-model", "max_tokens": 0}, headers=key)
        assert bad.status_code == 400
        status = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "gw-admin"}).json()
        assert status["scope"] == "gateway"
        sonnet = next(a for a in status["aliases"] if a["alias"] == "sonnet")
        usage = final_message("fake-text")["usage"]
        want = {
            "input": 2 * usage["input_tokens"],
            "output": 2 * usage["output_tokens"],
            "cache_read": 2 * usage["cache_read_input_tokens"],
            "cache_creation": 2 * usage["cache_creation_input_tokens"],
        }
        assert sonnet["tokens"] == want
        assert sonnet["targets"][0]["tokens"] == want
        assert sonnet["requests"] == {"completed": 2} == sonnet["targets"][0]["requests"]
        for kind, value in want.items():
            assert (
                gw.sample("gateway_tokens_total", alias="sonnet", provider="claude", model="fake-text", type=kind)
                == value
            )
        mock = next(a for a in status["aliases"] if a["alias"] == "mock-model")
        assert mock["tokens"] == {"input": 0, "output": 0, "cache_read": 0, "cache_creation": 0}
        own = httpx.get(gw.url + "/v1/gateway/status", headers=key).json()
        assert own["scope"] == "key" and own["key"] == "key-1"
        sonnet = next(a for a in own["aliases"] if a["alias"] == "sonnet")
        assert sonnet["today"] == {"requests": 2, "tokens": want} and sonnet["state"] == "available"
        other = httpx.get(gw.url + "/v1/gateway/status", headers={"x-api-key": "gw-key-2"}).json()
        assert next(a for a in other["aliases"] if a["alias"] == "sonnet")["today"]["requests"] == 0
