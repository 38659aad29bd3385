"""A faithful fake of Claude on Microsoft Foundry, plus a fake Microsoft Entra ID authority, for tests.

:class:`FakeFoundry` runs one aiohttp application in a background thread on two 127.0.0.1 ports:

* plain HTTP — ``fake.base_url`` = ``http://127.0.0.1:PORT/anthropic`` (the value of
  ``ANTHROPIC_FOUNDRY_BASE_URL`` / ``AnthropicFoundry(base_url=…)``),
* HTTPS with a certificate from a throw-away CA the fake generates — ``fake.authority_url`` =
  ``https://127.0.0.1:TLS_PORT`` (the Entra authority) and ``fake.https_base_url`` (the same resource
  routes over TLS). ``fake.ca_file`` is the CA's PEM path; :meth:`FakeFoundry.ssl_context` builds a
  client context trusting it.

**Resource routes** (docs/wire-formats.md §5): ``POST /anthropic/v1/messages`` and
``POST /anthropic/v1/messages/count_tokens`` take the first-party body (``model`` = the deployment
name, which picks a FakeClaudeAPI scenario; unknown names behave like ``fake-text``) and answer
first-party JSON/SSE (ids unchanged) with ``request-id`` and ``apim-request-id`` headers and no
``anthropic-ratelimit-*``. An ``anthropic-version`` header is required (any value; 400
``invalid_request_error`` otherwise). Auth: an API key in ``x-api-key`` and/or ``api-key`` (the SDK
sends both; every key header present must hold a key from ``api_keys``), else
``Authorization: Bearer <token>`` issued by the fake authority for ``https://ai.azure.com/.default``,
not expired and not revoked (:meth:`FakeFoundry.revoke_tokens`). Failures use Azure's shape
``{"error": {"code": "401", "message": …}}`` (:data:`INVALID_KEY_MESSAGE` / :data:`INVALID_TOKEN_MESSAGE`).

**Scenarios.** FakeClaudeAPI's streaming scenarios (``fake-text``, ``fake-citations``, ``fake-tools``,
``fake-thinking``, ``fake-slow`` with disconnect counting, …), its ``fake-status-*`` names (Anthropic
envelope with that status) and the Azure-shaped :data:`AZURE_STATUS_SCENARIOS`: ``fake-azure-429``
(429 + ``retry-after: 5``), ``fake-azure-500``, ``fake-azure-content-filter`` (400). count_tokens
answers ``{"input_tokens": N}`` (:func:`count_input_tokens`).

**The Entra authority** implements what azure-identity needs for ``ClientSecretCredential``:

* ``GET /{tenant}/v2.0/.well-known/openid-configuration`` (MSAL's tenant discovery, used by the
  *sync* credential) — ``token_endpoint`` points back at the fake,
* ``POST /{tenant}/oauth2/v2.0/token`` with ``grant_type=client_credentials``, ``client_id``,
  ``client_secret`` (form or HTTP Basic) and ``scope`` — the *async* credential posts here directly,
  without discovery,
* ``GET /{tenant}/discovery/v2.0/keys`` (JWKS of the RS256 key that signs the issued JWTs).

Errors are Entra-shaped (``{"error": "invalid_client", "error_description": "AADSTS7000215: …",
"error_codes": […], …}``). Knobs: ``token_lifetime_s`` (``expires_in``), ``token_delay_s``.

**Configuring a client for the fake authority.** Both MSAL (``msal.authority.canonicalize``) and
azure-identity (``normalize_authority``) insist on ``https``; azure-identity prefixes ``https://`` to
a scheme-less authority, so ``authority=fake.authority_url`` and ``authority=fake.authority_host``
(``127.0.0.1:PORT``) both work. Trust the CA with the azure-core transport option
``connection_verify=fake.ca_file`` (accepted by both the sync and async credentials; the cleanest
way) — or, process-wide, ``REQUESTS_CA_BUNDLE`` (sync/requests) / ``SSL_CERT_FILE`` (async/aiohttp,
read by ``ssl.create_default_context``). The sync credential also needs
``disable_instance_discovery=True`` (else MSAL asks ``login.microsoftonline.com`` whether the host is
a known authority)::

    from azure.identity import ClientSecretCredential, get_bearer_token_provider
    credential = ClientSecretCredential(
        fake.tenant_id, fake.client_id, fake.client_secret,
        authority=fake.authority_url, disable_instance_discovery=True, connection_verify=fake.ca_file)
    provider = get_bearer_token_provider(credential, "https://ai.azure.com/.default")
    client = AnthropicFoundry(azure_ad_token_provider=provider, base_url=fake.base_url)

``azure.identity.aio.ClientSecretCredential`` takes the same arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import itertools
import json
import shutil
import ssl
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ._server import BackgroundServer, TokenLedger
from .claude_api import STATUS_SCENARIOS as CLAUDE_STATUS_SCENARIOS
from .claude_api import RecordedRequest, Scenario, accumulate, get_scenario

__all__ = [
    "AZURE_STATUS_SCENARIOS",
    "DEFAULT_CLIENT_ID",
    "DEFAULT_CLIENT_SECRET",
    "DEFAULT_TENANT_ID",
    "FOUNDRY_SCOPE",
    "INVALID_KEY_MESSAGE",
    "INVALID_TOKEN_MESSAGE",
    "EntraTokenRequest",
    "FakeFoundry",
    "FoundryRequest",
    "azure_error",
    "count_input_tokens",
]

Event = dict[str, Any]

FOUNDRY_SCOPE = "https://ai.azure.com/.default"
FOUNDRY_AUDIENCE = "https://ai.azure.com"
DEFAULT_TENANT_ID = "00000000-0000-4000-8000-0000000000aa"
DEFAULT_CLIENT_ID = "00000000-0000-4000-8000-0000000000c1"
DEFAULT_CLIENT_SECRET = "fake~client~secret"

INVALID_KEY_MESSAGE = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for "
    "an active subscription and use a correct regional API endpoint for your resource."
)
INVALID_TOKEN_MESSAGE = (
    "Unauthorized. Access token is missing, invalid, audience is incorrect (https://ai.azure.com), or have expired."
)

#: Azure-shaped model names -> (HTTP status, ``error.code``, ``error.message``, extra headers).
AZURE_STATUS_SCENARIOS: dict[str, tuple[int, str, str, dict[str, str]]] = {
    "fake-azure-429": (429, "429", "Rate limit is exceeded. Try again in 5 seconds.", {"retry-after": "5"}),
    "fake-azure-500": (
        500,
        "InternalServerError",
        "The service encountered an internal error. Please retry the request.",
        {},
    ),
    "fake-azure-content-filter": (
        400,
        "content_filter",
        "The response was filtered due to the prompt triggering Azure AI content management policy. Please "
        "modify your prompt and retry.",
        {},
    ),
}

_COUNTED_FIELDS = ("system", "messages", "tools", "tool_choice", "thinking")
_KEY_HEADERS = ("x-api-key", "api-key")


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def azure_error(code: str, message: str) -> dict[str, Any]:
    """Azure API Management's error shape ``{"error": {"code", "message"}}``."""
    return {"error": {"code": code, "message": message}}


def count_input_tokens(body: dict[str, Any]) -> int:
    """The fake's token count: from the content fields only, so ``model`` and key order don't matter."""
    counted = {k: body[k] for k in _COUNTED_FIELDS if k in body}
    return len(_compact(counted).encode()) // 4 + 3


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _int_b64url(n: int) -> str:
    return _b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


# ---------------------------------------------------------------------------------------------
# TLS material
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TlsFiles:
    directory: Path
    ca_file: Path
    cert_file: Path
    key_file: Path


def _make_tls_files() -> _TlsFiles:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost, written to a temp directory."""
    now = dt.datetime.now(dt.UTC)
    not_before, not_after = now - dt.timedelta(minutes=5), now + dt.timedelta(days=2)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Fake Foundry Test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory = Path(tempfile.mkdtemp(prefix="fake-foundry-"))
    files = _TlsFiles(directory, directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------

FoundryAuth = Literal["api-key", "bearer"]


@dataclass
class FoundryRequest(RecordedRequest):
    """A recorded resource request (``/anthropic/v1/…``); token exchanges are in ``token_requests``."""

    operation: Literal["messages", "count_tokens"] | None = None  # None: unknown path
    tls: bool = False  # arrived on the HTTPS port
    model: str | None = None  # the body's ``model`` (deployment name)
    scenario: str | None = None
    auth: FoundryAuth | None = None
    api_key_headers: tuple[str, ...] = ()  # which of x-api-key / api-key were present
    auth_error: str | None = None  # "missing", "bad-key", "unknown", "expired" or "revoked"
    anthropic_version: str | None = None  # the header
    anthropic_beta: str | None = None  # the header


@dataclass
class EntraTokenRequest:
    """One request to the fake authority (discovery, JWKS or token)."""

    method: str
    path: str
    kind: Literal["openid-configuration", "jwks", "token", "unknown"]
    tenant: str | None
    headers: dict[str, str]
    form: dict[str, str] = field(default_factory=dict)
    grant_type: str | None = None
    client_id: str | None = None
    scope: str | None = None
    secret_via: Literal["form", "basic"] | None = None
    error: str | None = None  # e.g. "invalid_client"; None on success
    access_token: str | None = None
    expires_in: int | None = None


@dataclass
class _Counters:
    disconnects: int = 0
    requests: list[FoundryRequest] = field(default_factory=list)
    token_requests: list[EntraTokenRequest] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------


class FakeFoundry(BackgroundServer):
    """The fake Foundry resource and Entra authority. ``with FakeFoundry() as fake: ...`` starts and stops it."""

    def __init__(
        self,
        *,
        api_keys: tuple[str, ...] | list[str] = ("foundry-key",),
        tenant_id: str = DEFAULT_TENANT_ID,
        client_id: str = DEFAULT_CLIENT_ID,
        client_secret: str = DEFAULT_CLIENT_SECRET,
        token_lifetime_s: int = 3600,
    ) -> None:
        self.api_keys = tuple(api_keys)
        self.listen_tls_port = 0  # the HTTPS site's port, set before start (0: a free one; --serve's --tls-port)
        self.tenant_id = tenant_id
        self.client_id = client_id
        self.client_secret = client_secret
        #: ``expires_in`` of Entra tokens issued from now on (also their server-side lifetime)
        self.token_lifetime_s = token_lifetime_s
        #: seconds the token endpoint waits before answering
        self.token_delay_s = 0.0
        self.https_base_url = ""  # https://127.0.0.1:TLS_PORT/anthropic
        self.authority_url = ""  # https://127.0.0.1:TLS_PORT
        self.authority_host = ""  # 127.0.0.1:TLS_PORT
        self.ca_file = ""  # PEM of the CA that signed the TLS certificate
        self.tls_port = 0
        self._ledger = TokenLedger()
        self._token_counter = itertools.count(1)
        self._signing_key: rsa.RSAPrivateKey | None = None
        self._kid = uuid.uuid4().hex[:16]
        self._tls: _TlsFiles | None = None
        super().__init__()  # base_url: http://127.0.0.1:PORT/anthropic

    thread_name = "fake-foundry"

    def _new_state(self) -> _Counters:
        return _Counters()

    # -- public state -----------------------------------------------------------------------

    @property
    def requests(self) -> list[FoundryRequest]:
        with self._cond:
            return list(self._state.requests)

    @property
    def token_requests(self) -> list[EntraTokenRequest]:
        with self._cond:
            return list(self._state.token_requests)

    @property
    def issued_tokens(self) -> list[str]:
        """Every Entra access token issued so far, oldest first (``reset()`` does not forget them)."""
        with self._cond:
            return list(self._ledger.issued)

    def reset(self) -> None:
        """Forget recorded requests, token exchanges and disconnects (issued tokens stay valid)."""
        with self._cond:
            self._state = _Counters()

    def issue_token(self, lifetime_s: int | None = None) -> str:
        """Mint an Entra access token directly (as if exchanged at the token endpoint)."""
        with self._cond:
            return self._mint(self.token_lifetime_s if lifetime_s is None else lifetime_s)

    def revoke_tokens(self) -> int:
        """Revoke every Entra token issued so far: they get 401 from now on. Returns how many were live."""
        with self._cond:
            return self._ledger.revoke_all()

    def ssl_context(self) -> ssl.SSLContext:
        """A client-side context trusting the fake's CA (for httpx, aiohttp, urllib …)."""
        if not self.ca_file:
            raise RuntimeError("start the FakeFoundry first")
        return ssl.create_default_context(cafile=self.ca_file)

    @property
    def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set of the key that signs issued tokens."""
        if self._signing_key is None:
            return {"keys": []}
        numbers = self._signing_key.public_key().public_numbers()
        jwk = {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self._kid}
        return {"keys": [{**jwk, "n": _int_b64url(numbers.n), "e": _int_b64url(numbers.e)}]}

    def _mint(self, lifetime_s: int) -> str:  # with self._cond held
        assert self._signing_key is not None, "start the FakeFoundry first"
        now = int(time.time())
        n = next(self._token_counter)
        claims = {
            "aud": FOUNDRY_AUDIENCE,
            "iss": f"https://sts.windows.net/{self.tenant_id}/",
            "iat": now,
            "nbf": now,
            "exp": now + lifetime_s,
            "appid": self.client_id,
            "idtyp": "app",
            "oid": str(uuid.UUID(int=n)),
            "sub": str(uuid.UUID(int=n)),
            "tid": self.tenant_id,
            "uti": f"fake-{n}",
            "ver": "1.0",
        }
        header = {"typ": "JWT", "alg": "RS256", "kid": self._kid}
        signing_input = f"{_b64url(_compact(header).encode())}.{_b64url(_compact(claims).encode())}"
        signature = self._signing_key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
        token = f"{signing_input}.{_b64url(signature)}"
        return self._ledger.add(token, lifetime_s)

    def _record_token(self, req: EntraTokenRequest) -> None:
        with self._cond:
            self._state.token_requests.append(req)
            self._cond.notify_all()

    # -- lifecycle: the base's, plus TLS files made before and removed after ---------------------

    def start(self) -> None:
        if self._signing_key is None:
            self._signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._tls = _make_tls_files()
        self.ca_file = str(self._tls.ca_file)
        super().start()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._tls is not None:
                shutil.rmtree(self._tls.directory, ignore_errors=True)
                self._tls = None

    async def _astart(self) -> None:
        assert self._tls is not None
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(self._tls.cert_file, self._tls.key_file)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        self._runner = runner
        await web.TCPSite(runner, "127.0.0.1", self.listen_port).start()
        host, port = runner.addresses[0][:2]
        await web.TCPSite(runner, "127.0.0.1", self.listen_tls_port, ssl_context=server_ctx).start()
        tls_port = next(a[1] for a in runner.addresses if a[1] != port)
        self.port, self.tls_port = port, tls_port
        self.base_url = f"http://{host}:{port}/anthropic"
        self.https_base_url = f"https://{host}:{tls_port}/anthropic"
        self.authority_host = f"{host}:{tls_port}"
        self.authority_url = f"https://{host}:{tls_port}"

    # -- responses ------------------------------------------------------------------------------

    @staticmethod
    def _headers(request_id: str, **extra: str) -> dict[str, str]:
        return {"request-id": request_id, "apim-request-id": str(uuid.uuid4()), **extra}

    def _azure_error(self, status: int, code: str, message: str, request_id: str, **extra: str) -> web.Response:
        return web.Response(
            status=status,
            body=_compact(azure_error(code, message)).encode(),
            content_type="application/json",
            headers=self._headers(request_id, **extra),
        )

    def _anthropic_error(self, status: int, error_type: str, message: str, request_id: str) -> web.Response:
        payload = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}
        return web.Response(
            status=status,
            body=_compact(payload).encode(),
            content_type="application/json",
            headers=self._headers(request_id),
        )

    def _entra_error(self, status: int, error: str, code: int, description: str) -> web.Response:
        trace_id, correlation_id = str(uuid.uuid4()), str(uuid.uuid4())
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        payload = {
            "error": error,
            "error_description": f"AADSTS{code}: {description} Trace ID: {trace_id} Correlation ID: "
            f"{correlation_id} Timestamp: {stamp}",
            "error_codes": [code],
            "timestamp": stamp,
            "trace_id": trace_id,
            "correlation_id": correlation_id,
            "error_uri": f"{self.authority_url}/error?code={code}",
        }
        return web.json_response(payload, status=status)

    # -- dispatch --------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path.rstrip("/")
        if path.startswith("/anthropic/") or path == "/anthropic":
            return await self._resource(request, path, body)
        return await self._authority(request, path, body)

    # -- Entra authority ---------------------------------------------------------------------------

    async def _authority(self, request: web.Request, path: str, body: bytes) -> web.StreamResponse:
        parts = path.split("/")
        tenant = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
        rest = "/".join(parts[2:])
        kind: Literal["openid-configuration", "jwks", "token", "unknown"] = "unknown"
        if request.method == "GET" and rest == "v2.0/.well-known/openid-configuration":
            kind = "openid-configuration"
        elif request.method == "GET" and rest == "discovery/v2.0/keys":
            kind = "jwks"
        elif request.method == "POST" and rest == "oauth2/v2.0/token":
            kind = "token"
        record = EntraTokenRequest(
            method=request.method,
            path=request.path,
            kind=kind,
            tenant=tenant,
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        if kind == "unknown":
            record.error = "not_found"
            self._record_token(record)
            return web.json_response({"error": "not_found"}, status=404)
        if tenant != self.tenant_id:
            record.error = "invalid_tenant"
            self._record_token(record)
            return self._entra_error(
                400,
                "invalid_tenant",
                90002,
                f"Tenant '{tenant}' not found. Check to make sure you have the correct tenant ID and are signing "
                "into the correct cloud.",
            )
        if kind == "openid-configuration":
            self._record_token(record)
            return web.json_response(self._openid_configuration())
        if kind == "jwks":
            self._record_token(record)
            return web.json_response(self.jwks)
        return await self._token(request, body, record)

    def _openid_configuration(self) -> dict[str, Any]:
        base = f"{self.authority_url}/{self.tenant_id}"
        return {
            "token_endpoint": f"{base}/oauth2/v2.0/token",
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
            "jwks_uri": f"{base}/discovery/v2.0/keys",
            "response_modes_supported": ["query", "fragment", "form_post"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
            "issuer": f"{base}/v2.0",
            "request_uri_parameter_supported": False,
            "userinfo_endpoint": f"{self.authority_url}/oidc/userinfo",
            "authorization_endpoint": f"{base}/oauth2/v2.0/authorize",
            "device_authorization_endpoint": f"{base}/oauth2/v2.0/devicecode",
            "http_logout_supported": True,
            "frontchannel_logout_supported": True,
            "end_session_endpoint": f"{base}/oauth2/v2.0/logout",
            "claims_supported": ["sub", "iss", "aud", "exp", "iat", "nonce", "tid", "ver", "oid"],
            "kerberos_endpoint": f"{base}/kerberos",
            "tenant_region_scope": "NA",
            "cloud_instance_name": "microsoftonline.com",
            "cloud_graph_host_name": "graph.windows.net",
            "msgraph_host": "graph.microsoft.com",
            "rbac_url": "https://pas.windows.net",
        }

    async def _token(self, request: web.Request, body: bytes, record: EntraTokenRequest) -> web.Response:
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        record.form, record.grant_type, record.scope = form, form.get("grant_type"), form.get("scope")
        client_id, secret = form.get("client_id"), form.get("client_secret")
        if secret is not None:
            record.secret_via = "form"
        basic = request.headers.get("Authorization", "")
        if basic[:6].lower() == "basic ":
            with contextlib.suppress(ValueError):
                user, _, password = base64.b64decode(basic[6:]).decode().partition(":")
                client_id, secret = unquote(user), unquote(password)
                record.secret_via = "basic"
        record.client_id = client_id
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s)
        failure = self._check_client_credentials(record.grant_type, client_id, secret, record.scope)
        if failure is not None:
            status, error, code, description = failure
            record.error = error
            self._record_token(record)
            return self._entra_error(status, error, code, description)
        lifetime = int(self.token_lifetime_s)
        with self._cond:
            token = self._mint(lifetime)
        record.access_token, record.expires_in = token, lifetime
        self._record_token(record)
        payload = {"token_type": "Bearer", "expires_in": lifetime, "ext_expires_in": lifetime, "access_token": token}
        return web.json_response(payload, headers={"Cache-Control": "no-store, no-cache", "Pragma": "no-cache"})

    def _check_client_credentials(
        self, grant_type: str | None, client_id: str | None, secret: str | None, scope: str | None
    ) -> tuple[int, str, int, str] | None:
        if grant_type != "client_credentials":
            return 400, "unsupported_grant_type", 70003, f"The app requested an unsupported grant type '{grant_type}'."
        if client_id != self.client_id:
            return (
                400,
                "unauthorized_client",
                700016,
                f"Application with identifier '{client_id}' was not found in the directory '{self.tenant_id}'.",
            )
        if not secret:
            return (
                401,
                "invalid_client",
                7000218,
                "The request body must contain the following parameter: 'client_assertion' or 'client_secret'.",
            )
        if secret != self.client_secret:
            return (
                401,
                "invalid_client",
                7000215,
                "Invalid client secret provided. Ensure the secret being sent in the request is the client secret "
                f"value, not the client secret ID, for a secret added to app '{self.client_id}'.",
            )
        scopes = (scope or "").split()
        if len(scopes) != 1 or not scopes[0].endswith("/.default"):
            return (
                400,
                "invalid_scope",
                1002012,
                f"The provided value for scope {scope} is not valid. Client credential flows must have a scope "
                "value with /.default suffixed to the resource identifier (application ID URI).",
            )
        if scopes[0] != FOUNDRY_SCOPE:
            resource = scopes[0].removesuffix("/.default")
            return (
                400,
                "invalid_resource",
                500011,
                f"The resource principal named {resource} was not found in the tenant named {self.tenant_id}.",
            )
        return None

    # -- Foundry resource ------------------------------------------------------------------------

    async def _resource(self, request: web.Request, path: str, body: bytes) -> web.StreamResponse:
        parsed: Any = None
        if body:
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        headers = {k.lower(): v for k, v in request.headers.items()}
        record = FoundryRequest(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=headers,
            body=body,
            json=parsed,
            tls=request.secure,
            anthropic_version=headers.get("anthropic-version"),
            anthropic_beta=headers.get("anthropic-beta"),
        )
        if request.method == "POST" and path == "/anthropic/v1/messages":
            record.operation = "messages"
        elif request.method == "POST" and path == "/anthropic/v1/messages/count_tokens":
            record.operation = "count_tokens"
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            record.model = parsed["model"]
            record.scenario = parsed["model"]
        self._authenticate(headers, record)
        self._record(record)
        request_id = f"req_{uuid.uuid4().hex[:24]}"
        if record.auth_error is not None:
            message = INVALID_TOKEN_MESSAGE if record.auth == "bearer" else INVALID_KEY_MESSAGE
            return self._azure_error(401, "401", message, request_id)
        if record.operation is None:
            return self._azure_error(404, "404", "Resource not found", request_id)
        if not record.anthropic_version:
            return self._anthropic_error(
                400, "invalid_request_error", "anthropic-version: header is required", request_id
            )
        if not isinstance(parsed, dict):
            return self._anthropic_error(400, "invalid_request_error", "body: invalid JSON", request_id)
        model = record.model
        if not model:
            return self._anthropic_error(400, "invalid_request_error", "model: Field required", request_id)
        if model in AZURE_STATUS_SCENARIOS:
            status, code, message, extra = AZURE_STATUS_SCENARIOS[model]
            return self._azure_error(status, code, message, request_id, **extra)
        if model in CLAUDE_STATUS_SCENARIOS:
            status, error_type, message = CLAUDE_STATUS_SCENARIOS[model]
            return self._anthropic_error(status, error_type, message, request_id)
        if record.operation == "count_tokens":
            return web.Response(
                status=200,
                body=_compact({"input_tokens": count_input_tokens(parsed)}).encode(),
                content_type="application/json",
                headers=self._headers(request_id),
            )
        scenario = get_scenario(model)
        if parsed.get("stream") is True:
            return await self._stream(request, scenario, request_id)
        return await self._non_stream(request, scenario, request_id)

    def _authenticate(self, headers: dict[str, str], record: FoundryRequest) -> None:
        present = tuple(h for h in _KEY_HEADERS if h in headers)
        record.api_key_headers = present
        if present:
            record.auth = "api-key"
            if not all(headers[h] in self.api_keys for h in present):
                record.auth_error = "bad-key"
            return
        authorization = headers.get("authorization", "")
        if authorization[:7].lower() == "bearer " and authorization[7:].strip():
            record.auth = "bearer"
            with self._cond:
                status = self._ledger.status(authorization[7:].strip())
            if status != "valid":
                record.auth_error = status
            return
        record.auth_error = "missing"

    async def _stream(self, request: web.Request, scenario: Scenario, request_id: str) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=200,
            headers=self._headers(
                request_id, **{"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
            ),
        )
        return await self._send_sse(request, resp, scenario.events, scenario)

    async def _non_stream(self, request: web.Request, scenario: Scenario, request_id: str) -> web.StreamResponse:
        if scenario.ending == "error":
            return self._anthropic_error(529, "overloaded_error", "Overloaded", request_id)
        if scenario.ending == "cut":
            self._abort(request)
            return web.Response(status=500)  # never reaches the client
        if not await self._pace_json(request, scenario):
            return web.Response(status=499)
        return web.Response(
            status=200,
            body=_compact(accumulate(scenario.events)).encode(),
            content_type="application/json",
            headers=self._headers(request_id),
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the fake until Ctrl-C and print its URLs")
    parser.add_argument("--port", type=int, default=0, help="the resource's HTTP port (default: a free one)")
    parser.add_argument("--tls-port", type=int, default=0, help="the HTTPS port of the resource and the authority")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.print_help()
        return 0
    fake = FakeFoundry()
    fake.listen_port, fake.listen_tls_port = args.port, args.tls_port
    with fake:
        print(fake.base_url, fake.authority_url, fake.ca_file, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
