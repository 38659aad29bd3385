"""The governed gateway of ``bench.run`` (issue 36): the same config as the plain one plus what an organisation turns
on — the usage ledger on SQLite, limits over Redis (limits no request reaches, so every request is admitted, counted
and settled) and its identity provider's JWTs instead of a static key. The identity provider is this module: an RSA
key made for the run, its JWKS served on 127.0.0.1 by the runner (fetched once by the gateway, then cached), and one
token the load generator sends as ``Authorization: Bearer``; the gateway verifies its signature once and remembers
it until its ``exp`` (``gateway.governance.jwt_auth``), as it would a real client's."""

from __future__ import annotations

import asyncio
import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["AUDIENCE", "IdentityProvider", "governed_yaml"]

AUDIENCE = "messages-gateway-bench"
_KID = "bench-1"


class IdentityProvider:
    """A key pair, its JWKS on ``http://{host}:{port}/jwks`` (any GET gets it), and tokens signed with it."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        self.jwks = json.dumps({"keys": [public | {"kid": _KID, "use": "sig", "alg": "RS256"}]}).encode()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.fetches = 0  # JWKS requests answered (the gateway's: once, then cached)

    @property
    def issuer(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.fetches += 1
            head = (
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                f"content-length: {len(self.jwks)}\r\nconnection: close\r\n\r\n"
            )
            writer.write(head.encode() + self.jwks)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def token(self, subject: str = "bench-user", lifetime_s: float = 6 * 3600) -> str:
        now = int(time.time())
        claims = {"iss": self.issuer, "aud": AUDIENCE, "sub": subject, "iat": now, "exp": now + int(lifetime_s)}
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"kid": _KID})

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def governed_yaml(idp: IdentityProvider) -> str:
    """The ``auth`` block of the governed gateway: the identity provider's tokens only (no static key)."""
    return (
        f'auth: {{jwt: {{issuer: "{idp.issuer}", audience: "{AUDIENCE}", jwks_url: "{idp.issuer}/jwks", '
        "algorithms: [RS256]}}\n"
    )
