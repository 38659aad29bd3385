"""A local identity provider for the JWT tests: an OpenID discovery document and a JWKS served on 127.0.0.1
(a thread of ``http.server``), RSA and EC signing keys, and tokens signed with them — including the refused
kinds (``alg: none``, HS256 signed with the public key), built by hand since PyJWT rightly will not make them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

AUDIENCE = "messages-gateway"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class LocalIssuer:
    def __init__(self) -> None:
        self.private: dict[str, Any] = {}  # kid -> private key
        self.published: list[str] = []  # the kids the JWKS lists
        self.hits = 0
        self.add_key("k1")
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks"}
                elif self.path == "/jwks":
                    issuer.hits += 1
                    body = {"keys": [issuer.jwk(kid) for kid in issuer.published]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def add_key(self, kid: str, kind: str = "RSA", *, publish: bool = True) -> None:
        self.private[kid] = (
            rsa.generate_private_key(65537, 2048) if kind == "RSA" else ec.generate_private_key(ec.SECP256R1())
        )
        if publish:
            self.published.append(kid)

    def jwk(self, kid: str) -> dict[str, Any]:
        public = self.private[kid].public_key()
        if isinstance(public, rsa.RSAPublicKey):
            out: dict[str, Any] = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public))
            out["alg"] = "RS256"
        else:
            out = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(public))
        return {**out, "kid": kid, "use": "sig"}

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        base = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": "u-1",
            "email": "alice@example.com",
            "groups": ["staff", "pay"],
        }
        return {**base, "iat": now, "exp": now + 600, **overrides}

    def token(self, kid: str = "k1", **overrides: Any) -> str:
        key = self.private[kid]
        alg = "RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256"
        claims = {k: v for k, v in self.claims(**overrides).items() if v is not None}
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid})

    def unsigned(self, **overrides: Any) -> str:
        header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "k1"}).encode())
        return f"{header}.{_b64(json.dumps(self.claims(**overrides)).encode())}."

    def hs256_with_public_key(self, kid: str = "k1") -> str:
        """The classic confusion: an HMAC over the token, keyed with the issuer's *public* key (PEM)."""
        pem = (
            self.private[kid]
            .public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        payload = _b64(json.dumps(self.claims()).encode())
        signature = hmac.new(pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(signature)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
