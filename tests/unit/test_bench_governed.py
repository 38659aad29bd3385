"""The governed gateway of ``bench.run`` (``bench/governed.py``): its identity provider's token is one the gateway's
own JWT verifier accepts (through the JWKS it serves, fetched once), and the config it writes is one the gateway
reads — so the governed phases measure governance, not a refused bearer."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from bench.governed import AUDIENCE, IdentityProvider, governed_yaml
from bench.run import gateway_config
from gateway.governance.jwt_auth import JwtVerifier
from gateway.settings import JwtSettings, parse_settings
from gateway.wire.errors import AuthenticationError


def test_the_bench_token_is_verified_by_the_gateways_verifier_through_the_served_jwks() -> None:
    async def main() -> None:
        idp = IdentityProvider("127.0.0.1")
        await idp.start()
        try:
            settings = JwtSettings(issuer=idp.issuer, audience=AUDIENCE, jwks_url=f"{idp.issuer}/jwks")
            verifier = JwtVerifier(settings)
            token = idp.token(subject="bench-user")
            for _ in range(3):
                principal = await verifier.principal(token, {})
                assert principal.user == "bench-user"
            assert idp.fetches == 1  # fetched once, then remembered
            other = IdentityProvider("127.0.0.1")  # another key with the same kid: its token is refused
            other.port = idp.port
            forged = other.token(subject="mallory")
            with pytest.raises(AuthenticationError, match="signature does not verify"):
                await verifier.principal(forged, {})
        finally:
            await idp.aclose()

    asyncio.run(main())


def test_the_governed_config_is_read_by_the_gateway() -> None:
    idp = IdentityProvider("127.0.0.1")
    idp.port = 1234
    text = gateway_config(8080, 9090, "sqlite:////tmp/x.db", "redis://127.0.0.1:6379/0", governed_yaml(idp))
    settings = parse_settings(text, environ={})
    assert settings.auth.jwt is not None and settings.auth.jwt.audience == AUDIENCE
    assert settings.auth.jwt.jwks_url == "http://127.0.0.1:1234/jwks" and not settings.auth.open
    assert settings.limits is not None and settings.limits.redis_url == "redis://127.0.0.1:6379/0"
    assert msgspec.to_builtins(settings.store)["url"] == "sqlite:////tmp/x.db"
