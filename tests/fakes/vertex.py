"""A faithful fake of Claude on Google Vertex AI, plus a fake Google OAuth2 token endpoint, for tests.

:class:`FakeVertex` serves, on 127.0.0.1 from an aiohttp server in a background thread:

* ``POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:streamRawPredict``
  and ``…:rawPredict`` (docs/wire-formats.md §4.1): an Anthropic body **without** ``model`` and with
  ``"anthropic_version": "vertex-2023-10-16"``; the answer is first-party SSE when the body has
  ``"stream": true`` (whichever specifier was used — the body decides, the specifier is only recorded)
  and a first-party ``Message`` otherwise,
* ``POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/count-tokens:rawPredict``
  (the body **must** carry ``model``; answers ``{"input_tokens": N}``, see :func:`count_input_tokens`),
* ``POST /token``: a Google OAuth2 token endpoint (service-account JWT-bearer grant and the
  ``authorized_user`` refresh-token grant).

``fake.base_url`` (``http://127.0.0.1:PORT/v1``) is what replaces ``https://{host}/v1``: pass it as
``AnthropicVertex(base_url=…)`` / ``ANTHROPIC_VERTEX_BASE_URL``. ``fake.token_uri`` goes into the
service-account files made by :meth:`FakeVertex.make_service_account`, so google-auth talks to the fake
instead of ``oauth2.googleapis.com`` (for :meth:`FakeVertex.make_authorized_user` files google-auth ignores
the file's ``token_uri``: pass ``token_uri`` when building the credentials). :meth:`FakeVertex.issue_token`
mints a token directly (for ``AnthropicVertex(access_token=…)`` or a static-token gateway config).

**Authentication.** Every Vertex request needs ``Authorization: Bearer <token>`` where the token was
issued by this fake (through ``/token`` or :meth:`FakeVertex.issue_token`), is not older than the
``token_lifetime_s`` it was issued with, and was not revoked (:meth:`FakeVertex.revoke_tokens`); else
401 ``UNAUTHENTICATED`` in Google's error shape. A project other than ``fake.project`` gets 403
``PERMISSION_DENIED``. The token endpoint verifies the JWT assertion's RS256 signature against the
public key remembered by ``make_service_account``, ``iss`` (the client email), ``scope`` (must contain
``https://www.googleapis.com/auth/cloud-platform``), ``aud`` (``https://oauth2.googleapis.com/token`` —
what google-auth always sends, docs/wire-formats.md §7.1 — or ``token_uri``) and ``iat``/``exp``; failures
answer like Google (400 ``invalid_grant`` / ``invalid_scope``, 401 ``invalid_client``).
Knobs: ``token_lifetime_s`` (google-auth treats a token as expired 3 min 45 s early, so a lifetime
under 225 s makes every request refresh), ``token_delay_s`` (slow token endpoint).

**Body checks** (in this order, after auth and project): a JSON object (else 400 ``INVALID_ARGUMENT``,
Google shape); for (stream)RawPredict ``model`` absent (else 400 ``invalid_request_error``
"model: Extra inputs are not permitted", Anthropic envelope), ``anthropic_version`` present (else 400
``invalid_request_error`` "anthropic_version: Field required") and equal to ``vertex-2023-10-16``
(else 404 ``NOT_FOUND``, Google shape, as observed); for count-tokens ``model`` present (else 400
"model: Field required"; ``anthropic_version`` is not checked there).

**Strict by default** (``FakeVertex(strict=False)`` keeps only the checks above; ``extra_betas=`` or an assigned
``fake.beta_families`` widens the betas), after the JSON-object check
(issue 32): a beta of the ``anthropic-beta`` header (or of a body ``anthropic_beta``) whose family
(:func:`beta_family`, the name without its date) is not in :data:`BETA_FAMILIES` is 400 ``invalid_request_error``
"Unexpected value(s) `<beta>` for the `anthropic-beta` header. …" (the Anthropic API's wording); a top-level field
outside :data:`FIELDS` (count-tokens: :data:`COUNT_TOKENS_FIELDS`) is 400 "<key>: Extra inputs are not permitted"
(``model`` first, as above), and :data:`REFUSED_TOOL_FIELDS` in a tool definition is 400
"tools.<i>.<key>: Extra inputs are not permitted". Each refusal is recorded on the request
(:attr:`VertexRequest.refusal`, :attr:`VertexRequest.refused`; :attr:`FakeVertex.refusals`).

**Scenarios.** The model (path segment, or body ``model`` for count-tokens) minus an ``@date`` suffix
(:func:`scenario_name`) names a FakeClaudeAPI scenario (``fake-text``, ``fake-citations``,
``fake-tools``, ``fake-thinking``, ``fake-text-d200``, ``fake-slow`` …; unknown names behave like
``fake-text``), a FakeClaudeAPI status scenario (``fake-status-400/401/429/500/529``: the Anthropic
envelope with that status — model-level errors) or a Vertex-only one (:data:`GOOGLE_STATUS_SCENARIOS`:
``fake-quota`` 429 ``RESOURCE_EXHAUSTED``, ``fake-quota-list`` the same wrapped in ``[…]``,
``fake-precondition`` 400 ``FAILED_PRECONDITION``, ``fake-unavailable`` 503 ``UNAVAILABLE``).
Vertex rewrites ids (``msg_vrtx_…``, ``toolu_vrtx_…``, :func:`vrtx_ids`), echoes the model with ``@``
replaced by ``-``, sends ``request-id: req_vrtx_…`` and adds an ``event: vertex_event`` frame right
after ``message_delta`` (:func:`vertex_event`) that a gateway must drop (anthropic SDK 2.14 does *not* drop
it: its stream iterators yield it, only the message accumulator ignores it). ``fake-slow`` streams slowly
and counts client disconnects (``disconnects``, ``wait_for_disconnect()``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qsl, unquote

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from ._server import BackgroundServer, TokenLedger
from .claude_api import STATUS_SCENARIOS as CLAUDE_STATUS_SCENARIOS
from .claude_api import RecordedRequest, Scenario, accumulate, encode_event, get_scenario, rename_ids

__all__ = [
    "ANTHROPIC_VERSION",
    "BETA_FAMILIES",
    "CLOUD_PLATFORM_SCOPE",
    "COUNT_TOKENS_FIELDS",
    "FIELDS",
    "GOOGLE_STATUS_SCENARIOS",
    "GOOGLE_TOKEN_AUDIENCE",
    "JWT_GRANT_TYPE",
    "REFUSED_TOOL_FIELDS",
    "UNAUTHENTICATED_MESSAGE",
    "FakeVertex",
    "TokenRequest",
    "VertexRequest",
    "beta_family",
    "count_input_tokens",
    "final_vertex_message",
    "google_error",
    "make_authorized_user",
    "make_service_account",
    "scenario_name",
    "sign_jwt",
    "stream_body",
    "stream_events",
    "unexpected_betas_message",
    "vertex_event",
    "vrtx_ids",
]

Event = dict[str, Any]
_T = TypeVar("_T")

ANTHROPIC_VERSION = "vertex-2023-10-16"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"  # google-auth's JWT ``aud``, whatever token_uri is
JWT_GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
MAX_ASSERTION_LIFETIME_S = 3600
CLOCK_SKEW_S = 300

UNAUTHENTICATED_MESSAGE = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
_QUOTA_MESSAGE = (
    "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: "
    "anthropic-claude-fake. Please submit a quota increase request. "
    "https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai."
)

#: Vertex-only model names -> (HTTP status, Google ``status``, message); answered in Google's error shape.
GOOGLE_STATUS_SCENARIOS: dict[str, tuple[int, str, str]] = {
    "fake-quota": (429, "RESOURCE_EXHAUSTED", _QUOTA_MESSAGE),
    "fake-quota-list": (429, "RESOURCE_EXHAUSTED", _QUOTA_MESSAGE),  # body wrapped in a JSON array
    "fake-precondition": (400, "FAILED_PRECONDITION", "Precondition check failed."),
    "fake-unavailable": (503, "UNAVAILABLE", "The service is currently unavailable."),
}
_LIST_WRAPPED = frozenset({"fake-quota-list"})

_ROUTE_RE = re.compile(
    r"^/v1/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/publishers/anthropic/models/"
    r"(?P<model>[^/:]+):(?P<specifier>rawPredict|streamRawPredict)$"
)
_COUNTED_FIELDS = ("system", "messages", "tools", "tool_choice", "thinking")

# ---------------------------------------------------------------------------------------------
# What Vertex accepts (issue 32): the one place the fake's strictness is defined
# ---------------------------------------------------------------------------------------------

#: Beta families (a beta name without its ``-YYYY-MM-DD`` / ``-YYYYMMDD`` date) Claude on Vertex takes in the
#: ``anthropic-beta`` header. Sources: what Claude Code 2.1.332 sends Vertex in its own Vertex mode
#: (../shared/claude-code-traffic.md, Vertex-mode column: ``claude-code``, ``interleaved-thinking``, ``web-search``,
#: ``tool-search-tool``, ``effort``, ``thinking-token-count``) and Google's "Claude on Vertex AI" pages (betas in the
#: header: ``computer-use``, ``token-efficient-tools``, ``output-128k``, ``context-1m``,
#: ``fine-grained-tool-streaming``). Not taken: the first party's ``context-management``, ``per-turn-control``,
#: ``mid-conversation-tool-changes``, ``advanced-tool-use`` (Vertex gets ``tool-search-tool``), ``request-tags``,
#: ``prompt-caching-scope`` (LiteLLM #19984/#20021) …
BETA_FAMILIES = frozenset(
    {
        "claude-code",
        "interleaved-thinking",
        "web-search",
        "tool-search-tool",
        "effort",
        "thinking-token-count",
        "computer-use",
        "token-efficient-tools",
        "output-128k",
        "context-1m",
        "fine-grained-tool-streaming",
    }
)
#: Top-level ``:rawPredict`` / ``:streamRawPredict`` body fields: Bedrock InvokeModel's (AWS, "Anthropic Claude
#: Messages API — Request and Response"; the same Messages body less ``model``) plus ``stream``; the capture's
#: Vertex-mode column sends ``anthropic_version``, ``messages``, ``system``, ``tools``, ``metadata``, ``max_tokens``,
#: ``thinking``, ``output_config``, ``stream`` (no ``context_management``). Others (``model``,
#: ``context_management``, ``tags``, ``safeguards`` …): "<key>: Extra inputs are not permitted".
FIELDS = frozenset(
    {
        "anthropic_version",
        "anthropic_beta",
        "messages",
        "system",
        "max_tokens",
        "metadata",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
        "output_format",
        "stream",
    }
)
COUNT_TOKENS_FIELDS = FIELDS | {"model"}  # count-tokens:rawPredict names the model in the body
#: Tool-definition fields Vertex refuses: fine-grained tool streaming's per-tool flag (anthropics/claude-code#33229);
#: Claude Code in Vertex mode sends only ``name``, ``description``, ``input_schema``, ``defer_loading`` (the capture).
REFUSED_TOOL_FIELDS = frozenset({"eager_input_streaming"})

_BETA_DATE = re.compile(r"-\d{4}-?\d{2}-?\d{2}$")

# ---------------------------------------------------------------------------------------------
# Scenarios and wire helpers
# ---------------------------------------------------------------------------------------------


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def scenario_name(model: str) -> str:
    """The scenario a Vertex model id names: ``fake-text@20250929`` -> ``fake-text``."""
    return model.split("@", 1)[0]


def _echoed_model(model: str) -> str:
    """The ``model`` Vertex echoes: ``claude-sonnet-4-5@20250929`` -> ``claude-sonnet-4-5-20250929``."""
    return model.replace("@", "-")


def vrtx_ids(obj: _T) -> _T:
    """A deep copy of ``obj`` with FakeClaudeAPI ids (``msg_fake_…``) rewritten the Vertex way (``msg_vrtx_…``)."""
    renamed: _T = rename_ids(obj, "vrtx")
    return renamed


def _scenario(model: str) -> Scenario:
    return get_scenario(scenario_name(model))


def _vertex_scenario_events(model: str) -> list[Event]:
    """The scenario's events with Vertex ids and the echoed model (no ``vertex_event``)."""
    events: list[Event] = vrtx_ids(_scenario(model).events)
    for event in events:
        if event["type"] == "message_start":
            event["message"]["model"] = _echoed_model(model)
    return events


def vertex_event(events: list[Event]) -> Event:
    """The extra ``vertex_event`` frame Vertex adds to a stream: usage split by pricing tier."""
    message = accumulate(events)
    usage = message["usage"] if message else {}
    counts = {
        key: int(usage.get(key) or 0)
        for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    }
    return {"type": "vertex_event", "usage": {**counts, "tiers": {"standard": dict(counts)}}}


def stream_events(model: str) -> list[Event]:
    """Every event streamed for ``model`` (a Vertex model id), ``vertex_event`` included."""
    events = _vertex_scenario_events(model)
    out: list[Event] = []
    for i, event in enumerate(events):
        out.append(event)
        if event["type"] == "message_delta":
            out.append(vertex_event(events[: i + 1]))
    return out


def stream_body(model: str) -> bytes:
    """The exact SSE body streamed for ``model`` (a cut scenario stops early)."""
    return b"".join(encode_event(e) for e in stream_events(model))


def final_vertex_message(model: str) -> dict[str, Any]:
    """The ``:rawPredict`` JSON body for ``model`` (= what the stream accumulates to)."""
    message = accumulate(_vertex_scenario_events(model))
    assert message is not None
    return message


def count_input_tokens(body: dict[str, Any]) -> int:
    """The fake's token count: from the content fields only, so ``model``/``anthropic_version`` don't matter."""
    counted = {k: body[k] for k in _COUNTED_FIELDS if k in body}
    return len(_compact(counted).encode()) // 4 + 3


def beta_family(name: str) -> str:
    """A beta's feature: ``effort-2025-11-24`` -> ``effort`` (``claude-code-20250219`` -> ``claude-code``)."""
    return _BETA_DATE.sub("", name.strip())


def unexpected_betas_message(betas: list[str]) -> str:
    """The Anthropic API's answer to betas it does not know (Vertex relays it)."""
    listed = ", ".join(f"`{b}`" for b in betas)
    return (
        f"Unexpected value(s) {listed} for the `anthropic-beta` header. Please consult our documentation at "
        "docs.anthropic.com or try again without the header."
    )


def _refusal(
    betas: list[str], body: dict[str, Any], fields: frozenset[str], families: frozenset[str] = BETA_FAMILIES
) -> tuple[str, tuple[str, ...]] | None:
    """(message, refused) for what Vertex refuses of a request: unknown betas, then extra fields (the first one
    named in the message; ``model`` first of all), then refused tool fields."""
    unknown = [b for b in betas if beta_family(b) not in families]
    if unknown:
        return unexpected_betas_message(unknown), tuple(f"beta:{b}" for b in unknown)
    extra = sorted((k for k in body if k not in fields), key=lambda k: k != "model")
    messages = [f"{k}: Extra inputs are not permitted" for k in extra]
    refused = [f"field:{k}" for k in extra]
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        for key in sorted(REFUSED_TOOL_FIELDS.intersection(tool) if isinstance(tool, dict) else ()):
            messages.append(f"tools.{i}.{key}: Extra inputs are not permitted")
            if f"tool_field:{key}" not in refused:
                refused.append(f"tool_field:{key}")
    return (messages[0], tuple(refused)) if messages else None


def google_error(status: int, google_status: str, message: str, **extra: Any) -> dict[str, Any]:
    """Google's JSON error shape ``{"error": {"code", "message", "status", …}}``."""
    return {"error": {"code": status, "message": message, "status": google_status, **extra}}


# ---------------------------------------------------------------------------------------------
# JWTs and credential files
# ---------------------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_jwt(claims: dict[str, Any], private_key: rsa.RSAPrivateKey, *, kid: str | None = None) -> str:
    """An RS256 JWT (to forge assertions in tests; google-auth makes the real ones)."""
    header: dict[str, Any] = {"alg": "RS256", "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = f"{_b64url(_compact(header).encode())}.{_b64url(_compact(claims).encode())}"
    signature = private_key.sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


def _split_jwt(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes] | None:
    """(header, claims, signing input, signature) or None when malformed."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        header = json.loads(_b64url_decode(parts[0]))
        claims = json.loads(_b64url_decode(parts[1]))
        signature = _b64url_decode(parts[2])
    except ValueError:
        return None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        return None
    return header, claims, f"{parts[0]}.{parts[1]}".encode("ascii"), signature


@dataclass(frozen=True)
class _ServiceAccount:
    client_email: str
    client_id: str
    private_key_id: str
    public_key: rsa.RSAPublicKey


@dataclass(frozen=True)
class _AuthorizedUser:
    client_id: str
    client_secret: str
    refresh_token: str


def make_service_account(fake: FakeVertex, directory: Path | str, *, name: str = "gateway") -> Path:
    """Module-level spelling of :meth:`FakeVertex.make_service_account`."""
    return fake.make_service_account(directory, name=name)


def make_authorized_user(fake: FakeVertex, directory: Path | str) -> Path:
    """Module-level spelling of :meth:`FakeVertex.make_authorized_user`."""
    return fake.make_authorized_user(directory)


# ---------------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------------

VertexRoute = Literal["streamRawPredict", "rawPredict", "count-tokens"]


@dataclass
class VertexRequest(RecordedRequest):
    """A recorded Vertex request (token exchanges are in :attr:`FakeVertex.token_requests`)."""

    raw_path: str = ""
    route: VertexRoute | None = None  # None: unknown path
    project: str | None = None
    region: str | None = None
    model: str | None = None  # the path segment (unquoted), or the body ``model`` for count-tokens
    scenario: str | None = None
    anthropic_beta: str | None = None  # the ``anthropic-beta`` header
    anthropic_version: Any = None  # the body's ``anthropic_version``
    token: str | None = None  # the bearer token sent
    auth_error: str | None = None  # "missing", "unknown", "expired" or "revoked"
    refusal: str | None = None  # the message when the request was refused (a 400 the real service answers too)
    refused: tuple[str, ...] = ()  # what was refused: ``beta:<name>``, ``field:<key>``, ``tool_field:<key>``


@dataclass
class TokenRequest:
    """One exchange at ``POST /token``."""

    grant_type: str | None
    form: dict[str, str]
    headers: dict[str, str]
    jwt_header: dict[str, Any] | None = None  # JWT-bearer grant: the decoded assertion
    claims: dict[str, Any] | None = None
    client: str | None = None  # client_email (service account) or client_id (authorized user)
    error: str | None = None  # e.g. "invalid_grant: Invalid JWT Signature."; None when a token was issued
    access_token: str | None = None
    expires_in: int | None = None


@dataclass
class _Counters:
    disconnects: int = 0
    requests: list[VertexRequest] = field(default_factory=list)
    token_requests: list[TokenRequest] = field(default_factory=list)


class FakeVertex(BackgroundServer):
    """The fake Vertex AI endpoint and token server. ``with FakeVertex() as fake: ...`` starts and stops it."""

    def __init__(
        self,
        *,
        project: str = "fake-project",
        token_lifetime_s: int = 3600,
        strict: bool = True,
        extra_betas: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.project = project
        #: refuse unknown betas and fields as Vertex does (module docstring); False: only the older checks
        self.strict = strict
        #: the beta families taken: :data:`BETA_FAMILIES` plus ``extra_betas`` (names or families), e.g. a beta
        #: the provider ships before the gateway knows it (an operator's ``betas: {allow: …}``); assignable
        self.beta_families: frozenset[str] = BETA_FAMILIES | {beta_family(b) for b in extra_betas}
        #: ``expires_in`` of tokens issued from now on (also their server-side lifetime)
        self.token_lifetime_s = token_lifetime_s
        #: seconds the token endpoint waits before answering
        self.token_delay_s = 0.0
        #: the server-side lifetime of tokens issued from now on when shorter than ``expires_in`` (None: the
        #: same): a token that expires while a client still holds it (the middle of a long stream)
        self.token_valid_s: int | None = None
        self.token_uri = ""  # http://127.0.0.1:PORT/token
        self._ledger = TokenLedger()
        self._token_counter = itertools.count(1)
        self._accounts: dict[str, _ServiceAccount] = {}
        self._users: dict[str, _AuthorizedUser] = {}
        super().__init__()

    thread_name = "fake-vertex"

    def _new_state(self) -> _Counters:
        return _Counters()

    def _started(self, host: str, port: int) -> None:
        self.port = port
        self.base_url = f"http://{host}:{port}/v1"
        self.token_uri = f"http://{host}:{port}/token"

    # -- public state -----------------------------------------------------------------------

    @property
    def requests(self) -> list[VertexRequest]:
        with self._cond:
            return list(self._state.requests)

    @property
    def refusals(self) -> list[VertexRequest]:
        """The recorded requests refused for a beta or a field (``refusal`` set), oldest first."""
        return [r for r in self.requests if r.refusal is not None]

    @property
    def token_requests(self) -> list[TokenRequest]:
        with self._cond:
            return list(self._state.token_requests)

    @property
    def issued_tokens(self) -> list[str]:
        """Every access token issued so far, oldest first (``reset()`` does not forget them)."""
        with self._cond:
            return list(self._ledger.issued)

    def reset(self) -> None:
        """Forget recorded requests, token exchanges and disconnects (issued tokens stay valid)."""
        with self._cond:
            self._state = _Counters()

    def issue_token(self, lifetime_s: int | None = None) -> str:
        """Mint an access token directly (as if exchanged at ``/token``), e.g. for ``access_token=``."""
        with self._cond:
            return self._mint(self.token_lifetime_s if lifetime_s is None else lifetime_s)

    def revoke_tokens(self) -> int:
        """Revoke every token issued so far: they get 401 from now on. Returns how many were live."""
        with self._cond:
            return self._ledger.revoke_all()

    def token_status(self, token: str) -> Literal["valid", "unknown", "expired", "revoked"]:
        with self._cond:
            return self._ledger.status(token)

    def make_service_account(self, directory: Path | str, *, name: str = "gateway") -> Path:
        """Write a fresh service-account JSON key file (token_uri = this fake) and register its public key.

        Use it with ``google.oauth2.service_account.Credentials.from_service_account_file(path,
        scopes=[CLOUD_PLATFORM_SCOPE])`` or ``GOOGLE_APPLICATION_CREDENTIALS``. Needs ``token_uri``,
        i.e. a started fake.
        """
        if not self.token_uri:
            raise RuntimeError("start the FakeVertex before making credential files")
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode("ascii")
        serial = uuid.uuid4().hex
        email = f"{name}-{serial[:8]}@{self.project}.iam.gserviceaccount.com"
        account = _ServiceAccount(
            client_email=email,
            client_id=str(int(serial[:16], 16)),
            private_key_id=hashlib.sha1(pem.encode()).hexdigest(),
            public_key=key.public_key(),
        )
        info = {
            "type": "service_account",
            "project_id": self.project,
            "private_key_id": account.private_key_id,
            "private_key": pem,
            "client_email": email,
            "client_id": account.client_id,
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email}",
            "universe_domain": "googleapis.com",
        }
        path = Path(directory) / f"service-account-{serial[:8]}.json"
        path.write_text(json.dumps(info, indent=2))
        with self._cond:
            self._accounts[email] = account
        return path

    def make_authorized_user(self, directory: Path | str) -> Path:
        """Write an ``authorized_user`` JSON file (gcloud ADC style, token_uri = this fake) and register it.

        Caveat: google-auth (2.63) ignores ``token_uri`` in authorized_user info and always uses
        ``https://oauth2.googleapis.com/token``, so ``from_authorized_user_file``/ADC cannot reach the
        fake; build ``google.oauth2.credentials.Credentials(None, refresh_token=…, client_id=…,
        client_secret=…, token_uri=fake.token_uri)`` from the file's fields instead.
        """
        if not self.token_uri:
            raise RuntimeError("start the FakeVertex before making credential files")
        serial = uuid.uuid4().hex
        user = _AuthorizedUser(
            client_id=f"{serial[:12]}.apps.googleusercontent.com",
            client_secret=f"GOCSPX-{serial[12:]}",
            refresh_token=f"1//fake-refresh-{serial}",
        )
        info = {
            "type": "authorized_user",
            "client_id": user.client_id,
            "client_secret": user.client_secret,
            "refresh_token": user.refresh_token,
            "token_uri": self.token_uri,
            "quota_project_id": self.project,
            "universe_domain": "googleapis.com",
        }
        path = Path(directory) / f"authorized-user-{serial[:8]}.json"
        path.write_text(json.dumps(info, indent=2))
        with self._cond:
            self._users[user.client_id] = user
        return path

    def _mint(self, lifetime_s: int) -> str:  # with self._cond held
        return self._ledger.add(f"ya29.fake-{next(self._token_counter)}", lifetime_s)

    def _record_token(self, req: TokenRequest) -> None:
        with self._cond:
            self._state.token_requests.append(req)
            self._cond.notify_all()

    # -- responses ------------------------------------------------------------------------------

    @staticmethod
    def _google_error(
        status: int, google_status: str, message: str, *, wrap: bool = False, headers: dict[str, str] | None = None
    ) -> web.Response:
        payload: Any = google_error(status, google_status, message)
        if wrap:
            payload = [payload]
        return web.Response(
            status=status,
            body=(json.dumps(payload, indent=2) + "\n").encode(),
            headers={"Content-Type": "application/json; charset=UTF-8", **(headers or {})},
        )

    @staticmethod
    def _anthropic_error(status: int, error_type: str, message: str, request_id: str) -> web.Response:
        payload = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": request_id}
        return web.Response(
            status=status,
            body=_compact(payload).encode(),
            content_type="application/json",
            headers={"request-id": request_id},
        )

    @staticmethod
    def _oauth_error(status: int, error: str, description: str) -> web.Response:
        return web.Response(
            status=status,
            body=json.dumps({"error": error, "error_description": description}, indent=2).encode(),
            headers={"Content-Type": "application/json; charset=utf-8"},
        )

    # -- token endpoint -------------------------------------------------------------------------

    async def _token(self, request: web.Request, body: bytes) -> web.Response:
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        record = TokenRequest(
            grant_type=form.get("grant_type"),
            form=form,
            headers={k.lower(): v for k, v in request.headers.items()},
        )
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s)
        if record.grant_type == JWT_GRANT_TYPE:
            failure = self._check_assertion(form.get("assertion", ""), record)
        elif record.grant_type == "refresh_token":
            failure = self._check_refresh(form, record)
        else:
            failure = (400, "unsupported_grant_type", f"Invalid grant_type: {record.grant_type or ''}")
        if failure is not None:
            status, error, description = failure
            record.error = f"{error}: {description}"
            self._record_token(record)
            return self._oauth_error(status, error, description)
        lifetime = int(self.token_lifetime_s)
        with self._cond:
            token = self._mint(lifetime if self.token_valid_s is None else min(lifetime, self.token_valid_s))
        record.access_token, record.expires_in = token, lifetime
        self._record_token(record)
        payload: dict[str, Any] = {"access_token": token, "expires_in": lifetime, "token_type": "Bearer"}
        if record.grant_type == "refresh_token":
            payload["scope"] = CLOUD_PLATFORM_SCOPE
        return web.Response(
            status=200,
            body=json.dumps(payload, indent=2).encode(),
            headers={"Content-Type": "application/json; charset=utf-8", "Cache-Control": "no-store"},
        )

    def _check_assertion(self, assertion: str, record: TokenRequest) -> tuple[int, str, str] | None:
        parts = _split_jwt(assertion)
        if parts is None:
            return 400, "invalid_grant", "Invalid JWT: Not a valid JSON Web Token."
        header, claims, signing_input, signature = parts
        record.jwt_header, record.claims = header, claims
        issuer = claims.get("iss")
        record.client = issuer if isinstance(issuer, str) else None
        if header.get("alg") != "RS256":
            return 400, "invalid_grant", "Invalid JWT: Unsupported signing algorithm."
        with self._cond:
            account = self._accounts.get(issuer) if isinstance(issuer, str) else None
        if account is None:
            return 400, "invalid_grant", "Invalid grant: account not found"
        try:
            account.public_key.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return 400, "invalid_grant", "Invalid JWT Signature."
        if claims.get("aud") not in (GOOGLE_TOKEN_AUDIENCE, self.token_uri):
            return 400, "invalid_grant", f"Invalid JWT: Failed audience check. The right audience is {self.token_uri}"
        now = time.time()
        iat, exp = claims.get("iat"), claims.get("exp")
        if (
            not isinstance(iat, int | float)
            or not isinstance(exp, int | float)
            or exp <= now - CLOCK_SKEW_S
            or iat > now + CLOCK_SKEW_S
            or exp - iat > MAX_ASSERTION_LIFETIME_S
            or exp <= now
        ):
            return (
                400,
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
                "Check your iat and exp values in the JWT claim.",
            )
        scope = claims.get("scope")
        if not isinstance(scope, str) or CLOUD_PLATFORM_SCOPE not in scope.split():
            return 400, "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        return None

    def _check_refresh(self, form: dict[str, str], record: TokenRequest) -> tuple[int, str, str] | None:
        client_id = form.get("client_id", "")
        record.client = client_id or None
        with self._cond:
            user = self._users.get(client_id)
        if user is None or form.get("client_secret") != user.client_secret:
            return 401, "invalid_client", "Unauthorized"
        if form.get("refresh_token") != user.refresh_token:
            return 400, "invalid_grant", "Bad Request"
        scopes = form.get("scope")
        if scopes and CLOUD_PLATFORM_SCOPE not in scopes.split():
            return 400, "invalid_scope", "Invalid OAuth scope or ID token audience provided."
        return None

    # -- dispatch --------------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        raw_path = request.raw_path.partition("?")[0]
        if request.method == "POST" and raw_path == "/token":
            return await self._token(request, body)

        parsed: Any = None
        if body:
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        record = VertexRequest(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=parsed,
            raw_path=raw_path,
            anthropic_beta=request.headers.get("anthropic-beta"),
        )
        if isinstance(parsed, dict):
            record.anthropic_version = parsed.get("anthropic_version")
        m = _ROUTE_RE.match(raw_path) if request.method == "POST" else None
        if m is None:
            self._record(record)
            return self._google_error(404, "NOT_FOUND", f"The requested URL {raw_path} was not found on this server.")
        model_segment = unquote(m["model"])
        route: VertexRoute = "count-tokens" if model_segment == "count-tokens" else m["specifier"]  # type: ignore[assignment]
        if route == "count-tokens" and m["specifier"] != "rawPredict":
            self._record(record)
            return self._google_error(404, "NOT_FOUND", f"The requested URL {raw_path} was not found on this server.")
        record.route, record.project, record.region = route, unquote(m["project"]), unquote(m["region"])
        if route == "count-tokens":
            body_model = parsed.get("model") if isinstance(parsed, dict) else None
            record.model = body_model if isinstance(body_model, str) else None
        else:
            record.model = model_segment
        if record.model:
            record.scenario = scenario_name(record.model)

        authorization = request.headers.get("Authorization", "")
        if authorization[:7].lower() == "bearer " and authorization[7:].strip():
            record.token = authorization[7:].strip()
            with self._cond:
                status = self._ledger.status(record.token)
            if status != "valid":
                record.auth_error = status
        else:
            record.auth_error = "missing"
        self._record(record)

        if record.auth_error is not None:
            return self._google_error(
                401,
                "UNAUTHENTICATED",
                UNAUTHENTICATED_MESSAGE,
                headers={"WWW-Authenticate": 'Bearer realm="https://accounts.google.com/"'},
            )
        if record.project != self.project:
            resource = (
                f"projects/{record.project}/locations/{record.region}/publishers/anthropic/models/{model_segment}"
            )
            return self._google_error(
                403,
                "PERMISSION_DENIED",
                f"Permission 'aiplatform.endpoints.predict' denied on resource "
                f"'//aiplatform.googleapis.com/{resource}' (or it may not exist).",
            )
        if not isinstance(parsed, dict):
            return self._google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received. Expected an object.")

        request_id = f"req_vrtx_{uuid.uuid4().hex[:24]}"
        if self.strict:
            betas = [b.strip() for v in request.headers.getall("anthropic-beta", []) for b in v.split(",")]
            body_betas = parsed.get("anthropic_beta")
            if isinstance(body_betas, list):
                betas += [b for b in body_betas if isinstance(b, str)]
            fields = COUNT_TOKENS_FIELDS if route == "count-tokens" else FIELDS
            refusal = _refusal([b for b in betas if b], parsed, fields, self.beta_families)
            if refusal is not None:
                with self._cond:
                    record.refusal, record.refused = refusal
                return self._anthropic_error(400, "invalid_request_error", refusal[0], request_id)
        if route == "count-tokens":
            return self._count_tokens(parsed, record, request_id)
        if "model" in parsed:
            return self._anthropic_error(
                400, "invalid_request_error", "model: Extra inputs are not permitted", request_id
            )
        if "anthropic_version" not in parsed:
            return self._anthropic_error(400, "invalid_request_error", "anthropic_version: Field required", request_id)
        if parsed["anthropic_version"] != ANTHROPIC_VERSION:
            return self._google_error(
                404,
                "NOT_FOUND",
                f"Publisher Model `projects/{record.project}/locations/{record.region}/publishers/anthropic/"
                f"models/{model_segment}` was not found or your project does not have access to it. "
                "Please ensure you are using a valid model version.",
            )
        failure = self._scenario_failure(model_segment, request_id)
        if failure is not None:
            return failure
        if parsed.get("stream") is True:
            return await self._stream(request, model_segment, request_id)
        return await self._non_stream(request, model_segment, request_id)

    def _scenario_failure(self, model: str, request_id: str) -> web.Response | None:
        name = scenario_name(model)
        if name in GOOGLE_STATUS_SCENARIOS:
            status, google_status, message = GOOGLE_STATUS_SCENARIOS[name]
            return self._google_error(status, google_status, message, wrap=name in _LIST_WRAPPED)
        if name in CLAUDE_STATUS_SCENARIOS:
            status, error_type, message = CLAUDE_STATUS_SCENARIOS[name]
            return self._anthropic_error(status, error_type, message, request_id)
        return None

    def _count_tokens(self, body: dict[str, Any], record: VertexRequest, request_id: str) -> web.Response:
        if not record.model:
            return self._anthropic_error(400, "invalid_request_error", "model: Field required", request_id)
        failure = self._scenario_failure(record.model, request_id)
        if failure is not None:
            return failure
        return web.Response(
            status=200,
            body=_compact({"input_tokens": count_input_tokens(body)}).encode(),
            content_type="application/json",
            headers={"request-id": request_id},
        )

    async def _stream(self, request: web.Request, model: str, request_id: str) -> web.StreamResponse:
        scenario = _scenario(model)
        resp = web.StreamResponse(
            status=200,
            headers={
                "request-id": request_id,
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
            },
        )
        return await self._send_sse(request, resp, stream_events(model), scenario)

    async def _non_stream(self, request: web.Request, model: str, request_id: str) -> web.StreamResponse:
        scenario = _scenario(model)
        if scenario.ending == "error":
            return self._anthropic_error(529, "overloaded_error", "Overloaded", request_id)
        if scenario.ending == "cut":
            self._abort(request)
            return web.Response(status=500)  # never reaches the client
        if not await self._pace_json(request, scenario):
            return web.Response(status=499)
        return web.Response(
            status=200,
            body=_compact(final_vertex_message(model)).encode(),
            content_type="application/json",
            headers={"request-id": request_id},
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--serve", action="store_true", help="run the fake until Ctrl-C and print its URLs")
    parser.add_argument("--project", default="fake-project")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default: a free one)")
    args = parser.parse_args(argv)
    if not args.serve:
        parser.print_help()
        return 0
    fake = FakeVertex(project=args.project)
    fake.listen_port = args.port
    with fake:
        print(fake.base_url, fake.token_uri, fake.issue_token(), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
