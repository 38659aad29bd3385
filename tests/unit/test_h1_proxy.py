"""Corporate proxies (issue 37 item 8): the h1 client goes through an HTTP proxy — ``CONNECT`` for HTTPS (TLS end to
end through the tunnel), the absolute form for plain HTTP — named by the provider's ``proxy`` or by the standard
``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` variables (as google-auth, botocore and azure-identity read them, so a
provider's tokens and its inference take the same way out). Tested through a real proxy on 127.0.0.1
(``tests/fakes/connect_proxy.py``, proven against aiohttp, httpx and urllib), with the aiohttp client behind the same
seam held to the same outcome for the variables, and end to end through a gateway whose provider names a proxy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gateway.settings import ConfigError, parse_settings
from gateway.wire.errors import UpstreamConnectionError
from gateway.wire.upstream import AiohttpClient, H1Client, HttpClient, Timeouts, parse_proxy
from tests.conftest import run_gateway
from tests.fakes.claude_api import FakeClaudeAPI
from tests.fakes.connect_proxy import ConnectProxy
from tests.unit.test_connect_proxy_fake import _certificates, _origin

T = Timeouts(connect=5.0, read=5.0)
ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


async def post(client: HttpClient, url: str, timeouts: Timeouts = T) -> tuple[int, bytes]:
    resp = await client.send("POST", url, headers={"content-type": "text/plain"}, body=b"hello", timeouts=timeouts)
    return resp.status, await resp.read()


def test_https_goes_through_the_providers_proxy_in_a_tunnel(tmp_path: Path) -> None:
    server_tls, client_tls = _certificates(tmp_path)

    async def main() -> None:
        async with ConnectProxy() as proxy, _origin(server_tls) as (origin, seen):
            client = H1Client(ssl_context=client_tls)
            via = Timeouts(connect=5.0, read=5.0, proxy=proxy.url)
            try:
                for _ in range(3):  # one tunnel, kept alive end to end: the pool reuses it
                    assert await post(client, f"{origin}/echo", via) == (200, b"echo:hello")
            finally:
                await client.aclose()
            assert proxy.connects == [origin.removeprefix("https://")]
            assert all("Via" not in headers for headers in seen)  # TLS through the tunnel: the proxy saw no request

    asyncio.run(main())


def test_plain_http_goes_to_the_proxy_in_the_absolute_form_with_its_credentials() -> None:
    async def main() -> None:
        async with ConnectProxy(auth=("user", "p@ss")) as proxy, _origin() as (origin, seen):
            client = H1Client()
            try:
                refused = Timeouts(connect=5.0, read=5.0, proxy=proxy.url)  # no credentials: the proxy's own 407
                assert (await post(client, f"{origin}/echo?x=1", refused))[0] == 407
                via = Timeouts(connect=5.0, read=5.0, proxy=proxy.url_with_auth("user", "p%40ss"))
                assert await post(client, f"{origin}/echo?x=1", via) == (200, b"echo:hello")
            finally:
                await client.aclose()
            assert proxy.requests == [("POST", f"{origin}/echo?x=1")] and proxy.auth_failures == 1
            assert "Proxy-Authorization" not in seen[-1] and seen[-1]["Via"] == "1.1 connect-proxy"

    asyncio.run(main())


def test_a_proxy_that_refuses_the_tunnel_is_named_in_the_error(tmp_path: Path) -> None:
    server_tls, client_tls = _certificates(tmp_path)

    async def main() -> None:
        async with ConnectProxy(auth=("user", "pass")) as proxy, _origin(server_tls) as (origin, _):
            client = H1Client(ssl_context=client_tls)
            try:
                with pytest.raises(UpstreamConnectionError, match=r"proxy refused.*407"):
                    await post(client, f"{origin}/echo", Timeouts(connect=5.0, read=5.0, proxy=proxy.url))
            finally:
                await client.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("name", ["h1", "aiohttp"])
@pytest.mark.parametrize("bypass", [False, True], ids=["via-proxy", "no-proxy"])
def test_the_standard_variables_are_honoured(
    name: str, bypass: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTPS_PROXY`` and ``HTTP_PROXY`` send each scheme's requests through the proxy, ``NO_PROXY`` naming the
    host sends them direct — read by h1 as by aiohttp (``trust_env``) and the cloud SDKs."""
    server_tls, client_tls = _certificates(tmp_path)

    async def main() -> None:
        async with ConnectProxy() as proxy, _origin(server_tls) as (secure, _), _origin() as (plain, _):
            monkeypatch.setenv("HTTPS_PROXY", proxy.url)
            monkeypatch.setenv("http_proxy", proxy.url)
            if bypass:
                monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
            client: HttpClient
            if name == "h1":
                client = H1Client(ssl_context=client_tls)
            else:
                client = AiohttpClient()
                client._session.connector._ssl = client_tls  # type: ignore[attr-defined]  # (its trust: the test CA)
                # not aiohttp's trust_env: a thread-pool round trip per request (~3x its CPU): ProxyRoutes decides
                assert not client._session.trust_env
            try:
                assert await post(client, f"{secure}/echo") == (200, b"echo:hello")
                assert await post(client, f"{plain}/echo") == (200, b"echo:hello")
            finally:
                await client.aclose()
            if bypass:
                assert (proxy.connects, proxy.requests) == ([], [])
            else:
                assert proxy.connects == [secure.removeprefix("https://")]
                assert proxy.requests == [("POST", f"{plain}/echo")]

    asyncio.run(main())


def test_a_providers_proxy_setting_is_checked_at_start() -> None:
    with pytest.raises(ConfigError, match="proxy: a proxy is an http://host:port URL"):
        parse_settings(
            "providers: {p: {kind: anthropic, api_key: k, proxy: 'socks5://127.0.0.1:1080'}}\n"
            "models: {'*': {targets: [{provider: p}]}}\nauth: {open: true}",
            environ={},
        )
    assert parse_proxy("proxy.corp:3128") == ("proxy.corp", 3128, "")
    assert parse_proxy("http://a%40b:c@proxy.corp").authorization == "Basic YUBiOmM="  # a@b:c, port 80


def test_a_gateway_whose_provider_names_a_proxy_reaches_it_through_the_proxy(fake: FakeClaudeAPI) -> None:
    """End to end: a Messages request through the gateway reaches the fake provider through the provider's proxy,
    and the client gets the provider's answer."""
    with ConnectProxy() as proxy:
        config = (
            f"providers: {{p: {{kind: anthropic, api_key: k, base_url: '{fake.base_url}', proxy: '{proxy.url}'}}}}\n"
            "models: {'*': {targets: [{provider: p}]}}\nauth: {open: true}"
        )
        with run_gateway(config, upstream_client="h1") as gw:
            answer = httpx.post(
                f"{gw.url}/v1/messages",
                json={"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
        assert answer.status_code == 200, answer.text
        assert answer.json()["type"] == "message"
        assert [(method, url.split("?")[0]) for method, url in proxy.requests] == [
            ("POST", f"{fake.base_url}/v1/messages")
        ]
