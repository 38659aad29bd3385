"""Configuration: strict YAML, ``${VAR}`` / ``${VAR:-default}`` interpolation, errors with line numbers.

The YAML is composed into nodes (so every value keeps its line), interpolated from the environment,
then converted into strict msgspec Structs: an unknown key, a wrong type or a missing field is an
error that names the key and its line.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import msgspec
import msgspec.inspect
import yaml

__all__ = [
    "AdminSettings",
    "AnthropicProvider",
    "ApiKey",
    "AuthSettings",
    "AwsAuthSettings",
    "BedrockMantleProvider",
    "BedrockProvider",
    "BreakerSettings",
    "Budget",
    "ClaudeAwsProvider",
    "ConfigError",
    "DefaultLimits",
    "Endpoint",
    "EntraSettings",
    "FoundryProvider",
    "LimitSettings",
    "LoginSettings",
    "LongContextPrice",
    "ManagedPolicy",
    "ManagedSettings",
    "MetricsSettings",
    "MockProvider",
    "ModelRoute",
    "OidcSettings",
    "PolicyMatch",
    "Price",
    "ProviderConfig",
    "ReportSettings",
    "ResilienceSettings",
    "RetrySettings",
    "ServerSettings",
    "SessionSettings",
    "Settings",
    "StoreSettings",
    "TargetConfig",
    "TeamSettings",
    "TelemetrySettings",
    "TelemetryTarget",
    "TimeoutSettings",
    "VertexProvider",
    "default_config_path",
    "load_settings",
    "parse_settings",
    "parse_url",
]


class ConfigError(Exception):
    """An invalid configuration; the message names the file, the key and the line."""


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]


class ServerSettings(_Strict, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    max_request_bytes: Annotated[int, msgspec.Meta(gt=0)] = 32 * 1024 * 1024
    workers: Annotated[int, msgspec.Meta(ge=1)] = 1
    ping_interval_s: PositiveFloat = 10.0  # a `ping` event while the provider is silent this long
    drain_timeout_s: NonNegativeFloat = 30.0  # on SIGTERM: how long in-flight streams may finish
    forward_headers: list[str] | None = None  # client headers allowed upstream; None: anthropic-beta
    # OpenTelemetry traces and GenAI metrics over OTLP (`telemetry.otlp`; with no `telemetry.otlp` the standard
    # OTEL_EXPORTER_OTLP_* variables, or the OTLP/HTTP default http://localhost:4318, say where)
    tracing: bool = False
    ui: bool = True  # the browser pages: GET /playground and GET /status (static; they call the API with a key)
    # the longest silence tolerated while a client sends its request head (then the connection is closed) or
    # body (then 408 and close): nginx's client_header_timeout / client_body_timeout
    client_timeout_s: PositiveFloat = 60.0
    # how long an idle connection is kept between requests (nginx's keepalive_timeout): longer than clients' own
    # idle expiry (httpx 5 s, undici 4 s) and a load balancer's (ALB 60 s), so the client closes first
    keep_alive_timeout_s: PositiveFloat = 75.0
    # Messages requests in flight per process beyond which new ones get 529 + retry-after at once; None: no limit
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024  # request line + headers; over it: 431
    max_headers: Annotated[int, msgspec.Meta(ge=1)] = 100  # header fields per request; over it: 431


class RetrySettings(_Strict, frozen=True, kw_only=True):
    """Attempts before the first byte reaches the client (one per target try, the first included)."""

    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    base_delay_s: NonNegativeFloat = 0.5
    max_delay_s: NonNegativeFloat = 8.0


class BreakerSettings(_Strict, frozen=True, kw_only=True):
    """A target that fails ``failure_threshold`` times within ``window_s`` is skipped for ``cooldown_s``."""

    failure_threshold: Annotated[int, msgspec.Meta(ge=1)] = 5
    window_s: PositiveFloat = 60.0
    cooldown_s: PositiveFloat = 30.0


class TimeoutSettings(_Strict, frozen=True, kw_only=True):
    """Before the first event (per attempt) and for the whole request; the idle gap between reads is the
    provider's ``read_timeout_s`` and the connect time its ``connect_timeout_s``."""

    first_event_s: PositiveFloat = 120.0
    total_s: PositiveFloat = 3600.0


class ResilienceSettings(_Strict, frozen=True, kw_only=True):
    retry: RetrySettings = RetrySettings()
    breaker: BreakerSettings = BreakerSettings()
    timeouts: TimeoutSettings = TimeoutSettings()


class Budget(_Strict, frozen=True, kw_only=True):
    """US dollars per calendar window (UTC), priced from ``pricing``."""

    usd: PositiveFloat
    per: Literal["day", "week", "month"] = "month"


class LimitSettings(_Strict, frozen=True, kw_only=True):
    """Limits a request must pass (``gateway/governance/limits.py``); unset: no limit of that kind."""

    requests_per_minute: Annotated[int, msgspec.Meta(ge=1)] | None = None
    tokens_per_minute: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    budget: Budget | None = None


CertReqs = Literal["required", "optional", "none"]


# The Redis URL of limits.redis_url (the client, gateway.governance.redis_client, connects to what it says).
@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # a Unix socket
    tls: bool = False
    username: str | None = None
    password: str | None = None
    db: int = 0
    # rediss:// only, as redis-py's SSLConnection takes them from the URL's query (file paths, and the verify mode)
    ssl_ca_certs: str | None = None  # the CAs the server's certificate must chain to (instead of the system's)
    ssl_certfile: str | None = None  # a client certificate (PEM; its key too, unless ssl_keyfile)
    ssl_keyfile: str | None = None
    ssl_cert_reqs: CertReqs = "required"


# redis-py's names: SSLConnection's keyword arguments, which from_url fills from the query (redis-py 8.1,
# redis/connection.py; redis.readthedocs.io "SSL Connection Examples": rediss://host?ssl_cert_reqs=none), and
# ssl_cert_reqs's values: "The string value for the SSLContext.verify_mode (none, optional, required) ... Defaults
# to required"
_TLS_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_TLS_PARAMETERS = (*_TLS_FILES, "ssl_cert_reqs")
_CERT_REQS: tuple[CertReqs, ...] = ("required", "optional", "none")


def _tls_checked(tls: dict[str, str]) -> CertReqs:
    """The TLS options of a ``rediss://`` URL checked (its files readable now: a typo fails when the config is read,
    not at the first connect); their ``ssl_cert_reqs``."""
    said = tls.get("ssl_cert_reqs", "required")
    cert_reqs = next((value for value in _CERT_REQS if value == said), None)
    if cert_reqs is None:
        raise ValueError(f"limits.redis_url: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)} (got {said!r})")
    if "ssl_keyfile" in tls and "ssl_certfile" not in tls:
        raise ValueError("limits.redis_url: ssl_keyfile is the key of a client certificate: set ssl_certfile too")
    for name in _TLS_FILES:
        if name in tls:
            try:
                with open(tls[name], "rb"):  # readable by this user, not only there
                    pass
            except OSError as exc:
                raise ValueError(
                    f"limits.redis_url: {name} {tls[name]!r} cannot be read ({exc.strerror or exc})"
                ) from None
    return cert_reqs


def parse_url(url: str) -> Endpoint:
    """``redis://[[user]:password@]host[:port][/db]``, ``rediss://…`` (TLS) or ``unix://[[user]:password@]/path[?db=N]``;
    ``ValueError`` saying what is wrong otherwise. ``rediss://`` also takes redis-py's ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile`` (paths to files) and ``ssl_cert_reqs`` (``required``, ``optional``,
    ``none``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"limits.redis_url must start with redis://, rediss:// or unix:// (got {url.split(':')[0]!r})")
    query = parse_qs(parts.query)
    unknown = set(query) - {"db", *_TLS_PARAMETERS}
    if unknown:
        raise ValueError(
            f"limits.redis_url: unsupported parameter(s) {', '.join(sorted(unknown))} "
            f"(only db, and for rediss:// {', '.join(_TLS_PARAMETERS)})"
        )
    tls = {name: query[name][-1] for name in _TLS_PARAMETERS if name in query}
    if tls and parts.scheme != "rediss":
        raise ValueError(
            f"limits.redis_url: {', '.join(sorted(tls))} only go with rediss:// (TLS); "
            f"a {parts.scheme}:// connection is not encrypted"
        )
    cert_reqs = _tls_checked(tls)
    db_text = parts.path.strip("/") if parts.scheme != "unix" else ""
    if "db" in query:
        db_text = query["db"][-1]
    try:
        db = int(db_text or 0)
        port = parts.port if parts.scheme != "unix" else None
    except ValueError:
        raise ValueError(f"limits.redis_url: the database and the port must be numbers in {url!r}") from None
    if db < 0:
        raise ValueError("limits.redis_url: the database number must be 0 or more")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if username is not None and password is None:  # it would connect as `default`, not as the user it names
        raise ValueError(
            f"limits.redis_url: the user {username!r} has no password (redis://{username}:<password>@host; "
            "an ACL user always has one)"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("limits.redis_url: unix:// needs a socket path (unix:///run/redis.sock)")
        return Endpoint(path=parts.path, username=username, password=password, db=db)
    if not parts.hostname:
        raise ValueError(f"limits.redis_url: no host in {url!r}")
    return Endpoint(
        host=parts.hostname,
        port=port or 6379,
        tls=parts.scheme == "rediss",
        username=username,
        password=password,
        db=db,
        ssl_ca_certs=tls.get("ssl_ca_certs"),
        ssl_certfile=tls.get("ssl_certfile"),
        ssl_keyfile=tls.get("ssl_keyfile"),
        ssl_cert_reqs=cert_reqs,
    )


class DefaultLimits(LimitSettings, frozen=True, kw_only=True):
    """The top-level ``limits``: the default of every key, and where the counters live. ``redis_url``: counters
    shared by every worker and replica (Redis or Valkey; ``redis://:${REDIS_PASSWORD}@host:6379/0``; ``rediss://``
    for TLS, with redis-py's ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile`` and ``ssl_cert_reqs``; one
    endpoint, not a Redis Cluster, which is refused at start); unset: in this process. ``on_store_error``: when Redis
    cannot be reached, ``allow`` (serve, count the errors) or ``deny`` (529 overloaded_error)."""

    redis_url: str | None = None
    on_store_error: Literal["allow", "deny"] = "allow"

    def __post_init__(self) -> None:
        if self.redis_url is not None:
            parse_url(self.redis_url)  # ValueError: what is wrong with it


class TeamSettings(_Strict, frozen=True, kw_only=True):
    limits: LimitSettings | None = None
    models: list[str] | None = None  # aliases (globs) the team's keys may use, unless a key says otherwise


class ApiKey(_Strict, frozen=True, kw_only=True):
    """A named key. ``key`` is the secret itself, or ``key_sha256`` its SHA-256 digest in hex (so the file never
    holds the secret: ``printf %s "$KEY" | sha256sum``). ``team`` and ``user`` attribute its requests (the
    usage ledger and its reports)."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    key: str | None = None
    key_sha256: str | None = None
    models: list[str] | None = None  # aliases (globs allowed) this key may use; None: all
    team: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    user: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    limits: LimitSettings | None = None  # this key's own limits (instead of the top-level defaults)

    def __post_init__(self) -> None:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError(f"key {self.name!r}: set exactly one of key and key_sha256")
        if self.key is not None and not self.key.strip():
            raise ValueError(f"key {self.name!r} is empty or white space (an unset variable?)")
        if self.key_sha256 is not None and not _SHA256_HEX.fullmatch(self.key_sha256):
            raise ValueError(f"key {self.name!r}: key_sha256 must be 64 hexadecimal digits (a SHA-256 digest)")


_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


JwtAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
"""Asymmetric only: an HMAC algorithm would let a token signed with the (public) verification key through."""


class JwtSettings(_Strict, frozen=True, kw_only=True):
    """Bearer JWTs from the organisation's identity provider (``gateway/governance/jwt_auth.py``). The signature is
    checked against the issuer's JWKS (``jwks_url``, else the ``jwks_uri`` of
    ``{issuer}/.well-known/openid-configuration``), fetched and cached, refetched for a ``kid`` it does not hold;
    ``exp``, ``nbf``, ``iss`` and ``aud`` are checked. ``user_claim`` and ``team_claim`` name the claims that
    attribute the request (limits, ledger). ``unknown_team`` (with ``team_claim``): a token that names no team of
    ``teams`` is refused (``deny``, the default: 403) or may use every model (``allow``)."""

    issuer: Annotated[str, msgspec.Meta(min_length=1)]
    audience: Annotated[str, msgspec.Meta(min_length=1)]
    jwks_url: str | None = None
    user_claim: str = "sub"
    team_claim: str | None = None
    algorithms: tuple[JwtAlgorithm, ...] = ("RS256", "ES256")
    leeway_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 30.0
    jwks_cache_s: Annotated[float, msgspec.Meta(ge=1)] = 300.0
    unknown_team: Literal["deny", "allow"] = "deny"

    def __post_init__(self) -> None:
        for name, url in (("issuer", self.issuer), ("jwks_url", self.jwks_url)):
            if url is not None and not url.startswith(("https://", "http://")):
                raise ValueError(f"auth.jwt.{name}: an http(s) URL")
        if not self.algorithms:
            raise ValueError("auth.jwt.algorithms: at least one")


class AuthSettings(_Strict, frozen=True, kw_only=True):
    """``keys`` are accepted as x-api-key or Authorization: Bearer; so are the keys ``admin.keys`` issue at run
    time (``POST /v1/gateway/keys``) and, with ``jwt``, the identity provider's tokens. A gateway without any must
    say so with ``open: true``: an empty key (``${VAR}`` of a variable set but empty) or a missing ``auth``
    section is a config error, never a gateway that quietly serves everyone."""

    keys: list[str | ApiKey] = []
    open: bool = False
    jwt: JwtSettings | None = None

    def __post_init__(self) -> None:
        for position, entry in enumerate(self.keys, start=1):
            if isinstance(entry, str) and not entry.strip():
                raise ValueError(f"auth.keys entry {position} is empty or white space (an unset variable?)")
        if self.open and (self.keys or self.jwt is not None):
            raise ValueError("auth.open: true excludes auth.keys and auth.jwt: keep one")


class AdminSettings(_Strict, frozen=True, kw_only=True):
    """Keys for the operator's routes. With any: ``GET /metrics`` requires one (Prometheus sends it as a bearer
    token), and ``GET /v1/gateway/status`` shows everything only to one (a client key sees its own aliases)."""

    keys: list[str | ApiKey] = []
    # admin keys that may only read (the spend limits and their audit): a write with one is a 403
    read_keys: list[str | ApiKey] = []

    def __post_init__(self) -> None:
        for field, entries in (("keys", self.keys), ("read_keys", self.read_keys)):
            for position, entry in enumerate(entries, start=1):
                if isinstance(entry, str) and not entry.strip():
                    raise ValueError(f"admin.{field} entry {position} is empty or white space (an unset variable?)")


class BetaOverride(_Strict, frozen=True, kw_only=True):
    """An operator's change to a provider's beta profile (``adapters/profiles.py``): ``allow`` beta names (or
    their families, the names without the date) the gateway does not yet know the provider takes; ``drop`` ones it
    should not be sent (on the first party too)."""

    allow: list[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]] = []
    drop: list[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]] = []


class _Provider(_Strict, tag_field="kind", frozen=True, kw_only=True):
    connect_timeout_s: PositiveFloat = 10.0
    read_timeout_s: PositiveFloat = 600.0
    # idle keep-alive connections kept to the provider's origin (the h1 client; providers sharing an origin share
    # its pool, each keeping it within its own size); None: server.max_inflight, else 1024 — as many as were in
    # flight at once, so a second wave as large as the first opens no new connection (a TLS handshake each)
    pool_size: Annotated[int, msgspec.Meta(ge=0)] | None = None
    # an idle connection older than this is closed, not reused: shorter than providers' and load balancers' own
    # idle expiry (ALB 60 s), so the gateway closes first (aiohttp's keepalive_timeout: 15 s)
    pool_idle_s: PositiveFloat = 15.0
    # the proxy its requests go through (http://[user:password@]host:port; HTTPS through it with CONNECT); None:
    # HTTPS_PROXY / HTTP_PROXY / ALL_PROXY unless NO_PROXY names the provider's host, as the cloud SDKs read them
    proxy: str | None = None
    betas: BetaOverride = BetaOverride()  # the provider's beta profile, changed (adapters/profiles.py)
    drop_fields: list[str] = []  # top-level body fields this provider is never sent

    def __post_init__(self) -> None:
        if self.proxy is not None:
            from gateway.wire.upstream import parse_proxy

            try:
                parse_proxy(self.proxy)
            except ValueError as exc:
                raise ValueError(f"proxy: {exc}") from None


class AnthropicProvider(_Provider, tag="anthropic", frozen=True, kw_only=True):
    api_key: str | None = None
    base_url: str = "https://api.anthropic.com"
    forward_client_key: bool = False


class MockProvider(_Provider, tag="mock", frozen=True, kw_only=True):
    deltas: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 12
    event_delay_ms: NonNegativeFloat = 0.0
    first_event_delay_ms: NonNegativeFloat = 0.0


class AwsAuthSettings(_Provider, frozen=True, kw_only=True):
    """AWS credentials: explicit keys, a profile of the shared config, the standard chain (all empty), or a
    bearer API key. Secrets belong in the environment: ``secret_access_key: ${AWS_SECRET_ACCESS_KEY}``."""

    region: str | None = None  # None: AWS_REGION / AWS_DEFAULT_REGION / the profile's region / us-east-1
    base_url: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise ValueError("access_key_id and secret_access_key go together")
        if self.api_key and (self.access_key_id or self.profile):
            raise ValueError("api_key (bearer) and AWS keys/profile (SigV4) are alternatives; set one")


class BedrockProvider(AwsAuthSettings, tag="bedrock", frozen=True, kw_only=True):
    """Claude (InvokeModel) or any Converse model on Amazon Bedrock."""

    api: Literal["invoke", "converse"] = "invoke"
    anthropic_version: str = "bedrock-2023-05-31"


class BedrockMantleProvider(AwsAuthSettings, tag="bedrock_mantle", frozen=True, kw_only=True):
    """The Bedrock Messages endpoint: first-party ``/v1/messages`` at ``bedrock-mantle.{region}.api.aws/anthropic``."""

    signing_name: str = "bedrock-mantle"


class ClaudeAwsProvider(AwsAuthSettings, tag="claude_aws", frozen=True, kw_only=True):
    """Claude Platform on AWS: first-party API at ``aws-external-anthropic.{region}.api.aws``."""

    workspace_id: Annotated[str, msgspec.Meta(min_length=1)]
    signing_name: str = "aws-external-anthropic"


class VertexProvider(_Provider, tag="vertex", frozen=True, kw_only=True):
    """Claude on Google Vertex AI (rawPredict / streamRawPredict)."""

    project: str | None = None  # None: GOOGLE_CLOUD_PROJECT / ANTHROPIC_VERTEX_PROJECT_ID / the credentials'
    region: str = "global"
    credentials_file: str | None = None  # service-account / external-account / authorized-user JSON; None: ADC
    base_url: str | None = None  # replaces https://{host}/v1, as ANTHROPIC_VERTEX_BASE_URL does
    anthropic_version: str = "vertex-2023-10-16"


class EntraSettings(_Strict, frozen=True, kw_only=True):
    """Microsoft Entra ID. With ``client_secret``: that app registration; otherwise azure-identity's default
    chain (environment, workload identity, managed identity with ``client_id``, Azure CLI)."""

    tenant_id: str | None = None
    client_id: str | None = None
    client_secret: str | None = None
    authority: str | None = None  # e.g. login.microsoftonline.us; default: the public cloud
    scope: str = "https://ai.azure.com/.default"
    ca_file: str | None = None  # a PEM bundle to trust for the authority (a private CA); default: the system's

    def __post_init__(self) -> None:
        if self.client_secret and not (self.tenant_id and self.client_id):
            raise ValueError("entra.client_secret needs tenant_id and client_id")


class FoundryProvider(_Provider, tag="foundry", frozen=True, kw_only=True):
    """Claude on Microsoft Foundry: ``https://{resource}.services.ai.azure.com/anthropic`` (or ``base_url``)."""

    resource: str | None = None
    base_url: str | None = None  # ends in /anthropic, as ANTHROPIC_FOUNDRY_BASE_URL does
    api_key: str | None = None
    entra: EntraSettings | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if bool(self.resource) == bool(self.base_url):
            raise ValueError("set exactly one of resource and base_url")
        if bool(self.api_key) == (self.entra is not None):
            raise ValueError("set exactly one of api_key and entra")


ProviderConfig = (
    AnthropicProvider
    | MockProvider
    | BedrockProvider
    | BedrockMantleProvider
    | ClaudeAwsProvider
    | VertexProvider
    | FoundryProvider
)


class TargetConfig(_Strict, frozen=True, kw_only=True):
    provider: str
    model: str | None = None  # None: forward the client's model name unchanged
    weight: NonNegativeFloat = 1.0  # strategy: weighted


class ModelRoute(_Strict, frozen=True, kw_only=True):
    targets: Annotated[list[TargetConfig], msgspec.Meta(min_length=1)]
    display_name: str | None = None
    description: str | None = None  # GET /v1/models (Claude Code's model discovery shows it)
    # model ids the Bedrock- and Vertex-shaped routes map to this alias before the default rule (surfaces/)
    bedrock_ids: list[str] = []
    vertex_ids: list[str] = []
    strategy: Literal["fallback", "weighted", "round_robin", "least_latency"] = "fallback"
    ping_interval_s: PositiveFloat | None = None  # None: server.ping_interval_s
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None  # a ceiling for max_tokens
    # over the ceiling: reject (400, the default) or clamp (lowered to the ceiling; said in a response header)
    max_tokens_policy: Literal["reject", "clamp"] = "reject"


class LongContextPrice(_Strict, frozen=True, kw_only=True):
    """A model's prices for a request whose input (uncached, cache reads and cache writes together) is over
    ``above_input_tokens``: every token of that request is priced at these (as Anthropic prices Sonnet 4.5 over
    200K tokens and Haiku 5.5 over 100K)."""

    above_input_tokens: Annotated[int, msgspec.Meta(ge=1)]
    input: NonNegativeFloat = 0.0
    output: NonNegativeFloat = 0.0
    cache_read: NonNegativeFloat = 0.0
    cache_creation: NonNegativeFloat = 0.0


class Price(_Strict, frozen=True, kw_only=True):
    """US dollars per million tokens of each type (``cache_creation``: a cache write, at the rate of the cache
    lifetime the clients use; Anthropic's 5-minute writes are 1.25 times input, its 1-hour writes twice)."""

    input: NonNegativeFloat = 0.0
    output: NonNegativeFloat = 0.0
    cache_read: NonNegativeFloat = 0.0
    cache_creation: NonNegativeFloat = 0.0
    long_context: LongContextPrice | None = None  # a higher tier for long requests


class StoreSettings(_Strict, frozen=True, kw_only=True):
    """The usage ledger: one row per routed request. ``url``: ``sqlite:///path.db`` (relative to the working
    directory; ``sqlite:////abs/path.db``), ``postgresql://user:${PGPASSWORD}@host/db`` (``pip install
    'messages-gateway[postgres]'``) or ``memory://``; unset: ``sqlite:///$MESSAGES_GATEWAY_DATA_DIR/ledger.db``,
    ``data/ledger.db`` without the variable. Read at start-up: a reload does not move the ledger."""

    enabled: bool = True
    url: str | None = None
    retention_days: Annotated[int, msgspec.Meta(ge=1)] = 400
    flush_interval_s: PositiveFloat = 1.0
    max_queue_rows: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    max_queue_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(
            ("sqlite:///", "postgresql://", "postgres://", "memory://")
        ):
            raise ValueError("store.url: use sqlite:///path.db, postgresql://… or memory://")

    def resolved_url(self) -> str:
        if self.url is not None:
            return self.url
        return f"sqlite:///{os.environ.get('MESSAGES_GATEWAY_DATA_DIR') or 'data'}/ledger.db"


class ReportSettings(_Strict, frozen=True, kw_only=True):
    """The usage and cost reports (``gateway/http/reports.py``): at most ``concurrency`` built at once in a process
    (one more waits up to ``queue_s`` for a slot, then is a 429), at most ``per_minute`` admitted per principal (an
    admin key, a client key) in any 60 s (a 429 with ``retry-after`` beyond it), and at most ``max_results`` results
    a page (a page ends on the last whole bucket that fits; a single bucket holding more is a 400)."""

    max_results: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    concurrency: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    queue_s: NonNegativeFloat = 10.0
    per_minute: Annotated[int, msgspec.Meta(ge=1)] = 120


class MetricsSettings(_Strict, frozen=True, kw_only=True):
    """``labels``: also count requests, tokens and cost per client key and/or team
    (``gateway_key_requests_total``, ``gateway_key_tokens_total``, ``gateway_key_cost_usd_total``). Off by
    default: every key is a label value, so the series grow with the keys. Read at start-up."""

    labels: list[Literal["key", "team"]] = []

    def __post_init__(self) -> None:
        if len(set(self.labels)) != len(self.labels):
            raise ValueError("metrics.labels: each of key and team at most once")


class OidcSettings(_Strict, frozen=True, kw_only=True):
    """The organisation's OpenID Connect provider, for ``login`` (``gateway/governance/signin.py``): its
    ``issuer`` (its discovery document is ``{issuer}/.well-known/openid-configuration``), this gateway's client
    registration there (``client_id``, ``client_secret``; the redirect URI to register is
    ``{login.public_url}/oauth/callback``), the ``scopes`` asked for, and the id-token claims that carry the user's
    groups and email."""

    issuer: Annotated[str, msgspec.Meta(min_length=1)]
    client_id: Annotated[str, msgspec.Meta(min_length=1)]
    client_secret: str | None = None  # None: a public client (PKCE only)
    scopes: list[str] = msgspec.field(default_factory=lambda: ["openid", "email", "profile"])
    groups_claim: str = "groups"
    email_claim: str = "email"

    def __post_init__(self) -> None:
        if not self.issuer.startswith(("https://", "http://")):
            raise ValueError("login.oidc.issuer: an http(s) URL")
        if "openid" not in self.scopes:
            raise ValueError("login.oidc.scopes: must include openid")


class SessionSettings(_Strict, frozen=True, kw_only=True):
    """A signed-in session: its bearer lives ``ttl_s`` (Claude Code refreshes it when less than 5 minutes are left:
    under 300 s, at each start); the session itself ends ``max_age_s`` after sign-in (then ``/login`` again)."""

    ttl_s: Annotated[float, msgspec.Meta(ge=60, le=86_400)] = 3600.0
    max_age_s: Annotated[float, msgspec.Meta(ge=600)] = 30 * 86_400.0


class LoginSettings(_Strict, frozen=True, kw_only=True):
    """Claude Code's ``/login`` to this gateway (the Claude apps gateway protocol; ``docs/single-sign-on.md``):
    device authorization, the verification page, the organisation's identity provider, the bearers it mints.
    ``public_url``: the gateway's URL as developers' machines reach it (the device flow's links, the callback).
    ``notice``: a line shown in the CLI while it waits (``login_notice``)."""

    public_url: Annotated[str, msgspec.Meta(min_length=1)]
    oidc: OidcSettings
    session: SessionSettings = SessionSettings()
    notice: str | None = None
    device_code_ttl_s: Annotated[float, msgspec.Meta(ge=60, le=3600)] = 600.0
    poll_interval_s: Annotated[int, msgspec.Meta(ge=1, le=60)] = 5
    device_requests_per_minute: Annotated[int, msgspec.Meta(ge=1)] = 20  # per client IP

    def __post_init__(self) -> None:
        if not self.public_url.startswith(("https://", "http://")):
            raise ValueError("login.public_url: an http(s) URL")
        if self.public_url.endswith("/"):
            raise ValueError("login.public_url: without a trailing /")


class PolicyMatch(_Strict, frozen=True, kw_only=True):
    """Who a managed policy is for: a user in any of ``groups`` (the IdP's groups); no groups: everyone."""

    groups: list[str] = []


class ManagedPolicy(_Strict, frozen=True, kw_only=True):
    match: PolicyMatch = PolicyMatch()
    settings: dict[str, Any] = {}  # Claude Code's managed-settings.json, as it is


class ManagedSettings(_Strict, frozen=True, kw_only=True):
    """Claude Code's managed settings per group (``GET /managed/settings``): the first policy whose ``match``
    fits the signed-in user wins; none: 404. ``settings.availableModels`` also filters ``/v1/models`` and refuses
    other models."""

    policies: list[ManagedPolicy] = []


class TelemetryTarget(_Strict, frozen=True, kw_only=True):
    """A collector the CLI's OTLP/HTTP telemetry is relayed to: ``url`` is its base (``/v1/metrics`` etc. are
    appended), ``headers`` its own (an API key), ``signals`` which of metrics, logs and traces it gets."""

    url: Annotated[str, msgspec.Meta(min_length=1)]
    headers: dict[str, str] = {}
    signals: list[Literal["metrics", "logs", "traces"]] = msgspec.field(
        default_factory=lambda: ["metrics", "logs", "traces"]
    )

    def __post_init__(self) -> None:
        if not self.url.startswith(("https://", "http://")):
            raise ValueError("telemetry.forward_to.url: an http(s) URL")


class OtlpSettings(_Strict, frozen=True, kw_only=True):
    """The gateway's own traces and metrics, in OpenTelemetry's GenAI conventions, exported over OTLP
    (``docs/observability.md``): a SERVER span per request, a CLIENT span per upstream attempt, and the
    ``gen_ai.*`` histograms. A key left out takes its standard ``OTEL_*`` variable, then the OTLP default. Spans
    leave through a bounded queue off the request path; an export that fails is counted
    (``gateway_otlp_export_failures_total``), never felt by a request."""

    # the collector: a base URL (`/v1/traces` and `/v1/metrics` are appended for http/protobuf); default
    # OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318 (http/protobuf) or http://localhost:4317 (grpc)
    endpoint: str | None = None
    protocol: Literal["grpc", "http/protobuf"] | None = None  # default OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf
    headers: dict[str, str] = {}  # sent with every export (an API key); OTEL_EXPORTER_OTLP_HEADERS adds to them
    # the exports' bodies: gzip (the OpenTelemetry Collector's own OTLP exporters' default; ~25x fewer bytes, for
    # no CPU this machine can measure: ISA-L's deflate) or none; default OTEL_EXPORTER_OTLP_COMPRESSION, else gzip
    compression: Literal["gzip", "none"] | None = None
    # resource attributes beside service.name (OTEL_SERVICE_NAME, else messages-gateway), service.version and
    # service.instance.id; OTEL_RESOURCE_ATTRIBUTES adds to them
    resource_attributes: dict[str, str | int | float | bool] = {}
    signals: list[Literal["traces", "metrics"]] = msgspec.field(default_factory=lambda: ["traces", "metrics"])
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0  # of traces the gateway starts; a caller's
    # traceparent decides for its own (its sampled flag), as OpenTelemetry's parent-based sampler does
    timeout_s: PositiveFloat = 10.0  # one export's deadline (OTEL_EXPORTER_OTLP_TIMEOUT)
    schedule_delay_s: PositiveFloat = 5.0  # spans wait at most this long before they are sent (OTEL_BSP_SCHEDULE_DELAY)
    max_queue: Annotated[int, msgspec.Meta(ge=1)] = 2048  # spans waiting; more are dropped and counted
    max_batch: Annotated[int, msgspec.Meta(ge=1)] = 512  # spans in one export
    metrics_interval_s: PositiveFloat = 60.0  # how often the GenAI histograms are sent (OTEL_METRIC_EXPORT_INTERVAL)
    # the convention's opt-in content attributes (gen_ai.input.messages, gen_ai.system_instructions,
    # gen_ai.output.messages): prompts and answers in the spans. Off by default; keys never are
    capture_content: bool = False

    def __post_init__(self) -> None:
        if self.endpoint is not None and not self.endpoint.startswith(("https://", "http://")):
            raise ValueError("telemetry.otlp.endpoint: an http(s) URL")


class TelemetrySettings(_Strict, frozen=True, kw_only=True):
    """The CLI's telemetry (``POST /v1/metrics|logs|traces``): answered at once and relayed, off the request
    path, to each of ``forward_to`` through a queue of at most ``max_queue`` bodies (more are dropped and
    counted). ``otlp``: the gateway's own traces and metrics."""

    forward_to: list[TelemetryTarget] = []
    max_queue: Annotated[int, msgspec.Meta(ge=1)] = 1000
    timeout_s: PositiveFloat = 10.0
    otlp: OtlpSettings | None = None  # the gateway's own OpenTelemetry export (on when given, or server.tracing)


class Settings(_Strict, frozen=True, kw_only=True):
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    admin: AdminSettings = AdminSettings()
    resilience: ResilienceSettings = ResilienceSettings()
    providers: dict[str, ProviderConfig] = {}
    models: dict[str, ModelRoute] = {}
    # upstream model id (globs allowed, first match in file order) -> price; matched before the shipped table
    pricing: dict[str, Price] = {}
    # the gateway's own table of Claude list prices (gateway/governance/pricing.py) for every model `pricing` does
    # not match: first party, Bedrock (its regional premium), Vertex and Foundry ids alike; false: `pricing` only
    builtin_pricing: bool = True
    store: StoreSettings = StoreSettings()
    metrics: MetricsSettings = MetricsSettings()
    reports: ReportSettings = ReportSettings()
    limits: DefaultLimits | None = None  # the default limits of every key (a key's own replace them)
    teams: dict[str, TeamSettings] = {}
    login: LoginSettings | None = None  # Claude Code's /login: single sign-on (off when absent)
    managed: ManagedSettings = ManagedSettings()
    telemetry: TelemetrySettings = TelemetrySettings()

    def __post_init__(self) -> None:
        budgets = [self.limits, *(t.limits for t in self.teams.values())]
        budgets += [k.limits for k in self.auth.keys if isinstance(k, ApiKey)]
        budgeted = any(limits is not None and limits.budget is not None for limits in budgets)
        if budgeted and not self.pricing and not self.builtin_pricing:
            raise ValueError(
                "a budget needs prices: with builtin_pricing: false, add a `pricing` table for the models it covers"
                " - at `$.builtin_pricing`"
            )
        for i, entry in enumerate(self.auth.keys):
            if isinstance(entry, ApiKey) and entry.team and self.teams and entry.team not in self.teams:
                raise ValueError(
                    f"key {entry.name!r} names team {entry.team!r}, which `teams` does not list"
                    f"{_did_you_mean(entry.team, self.teams)} (teams: {', '.join(sorted(self.teams))})"
                    f" - at `$.auth.keys[{i}].team`"
                )
        jwt = self.auth.jwt
        if jwt is not None and jwt.team_claim is not None and jwt.unknown_team == "deny" and not self.teams:
            raise ValueError(
                "auth.jwt.team_claim with unknown_team: deny and no `teams` would refuse every token: "
                "list the teams, or say auth.jwt.unknown_team: allow - at `$.auth.jwt.team_claim`"
            )
        issuable = bool(self.admin.keys) and self.store.enabled  # keys issued at run time
        if self.login is not None and not self.store.enabled:
            raise ValueError(
                "login needs the store (device codes and sessions live there, shared by every replica): "
                "remove store.enabled: false - at `$.login`"
            )
        if self.login is not None and self.auth.open:
            raise ValueError("login with auth.open: true: a signed-in bearer would mean nothing - at `$.login`")
        if not self.auth.keys and not self.auth.open and self.auth.jwt is None and not issuable and not self.login:
            raise ValueError(
                "no auth.keys: list the keys clients must send, issue them at run time (admin.keys and the store), "
                "accept the identity provider's tokens (auth.jwt), or say `auth: {open: true}` to serve without one"
                " - at `$.auth`"
            )


def default_config_path() -> Path:
    """``config/gateway.yaml`` in the working directory, else the one beside this source tree."""
    here = Path("config/gateway.yaml")
    if here.exists():
        return here
    return Path(__file__).resolve().parent.parent / "config" / "gateway.yaml"


def load_settings(path: str | Path, environ: Mapping[str, str] | None = None) -> Settings:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_settings(text, source=str(path), environ=environ)


def parse_settings(text: str, *, source: str = "<config>", environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        # the line and column, and what is wrong — never the snippet of the line, which may hold a secret
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "not a YAML document"
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        column = f" (column {mark.column + 1})" if mark is not None else ""
        raise ConfigError(f"{where}: invalid YAML: {problem}{column}") from None
    lines: dict[str, int] = {}
    filled: list[_Filled] = []
    data = {} if node is None else _to_python(node, "$", lines, env, source, filled)
    for container, index, path, template in filled:  # "${PORT}" fills an int field as an int, then is checked
        where = f"{source}:{lines.get(path, 1)}"
        container[index] = _coerce(container[index], _type_at(path, data, resolve=False), where, template)
    # msgspec reports dict values as `[...]`; check keyed sections one entry at a time to name the key.
    for section, kind in _KEYED_SECTIONS:
        entries = data.get(section) if isinstance(data, dict) else None
        for name, value in entries.items() if isinstance(entries, dict) else ():
            try:
                msgspec.convert(value, kind)
            except msgspec.ValidationError as exc:
                message = str(exc).replace("at `$", f"at `$.{section}.{name}")
                if "at `$" not in message:
                    message += f" - at `$.{section}.{name}`"
                raise ConfigError(_locate(message, lines, source, data)) from exc
    try:
        settings = msgspec.convert(data, Settings)
    except msgspec.ValidationError as exc:
        raise ConfigError(_locate(str(exc), lines, source, data)) from exc
    _check_references(settings, lines, source)
    return settings


# (the dict or list holding an interpolated scalar, its key or index, its path, the text before it was filled)
_Filled = tuple[Any, Any, str, str]
_KEYED_SECTIONS: tuple[tuple[str, Any], ...] = (
    ("providers", ProviderConfig),
    ("models", ModelRoute),
    ("teams", TeamSettings),
    ("pricing", Price),
)


def _bare(t: Any) -> Any:
    """A type without the ``Annotated`` metadata msgspec.inspect wraps it in."""
    while isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    return t


def _member(t: Any, value: Any) -> Any:
    """``t`` with an Optional's None and a union's other members set aside, as far as ``value`` tells them apart (a
    tagged union by its tag field; a string or a mapping); a union it cannot tell apart stays a union."""
    t = _bare(t)
    if not isinstance(t, msgspec.inspect.UnionType):
        return t
    members: list[Any] = [m for m in t.types if not isinstance(m, msgspec.inspect.NoneType)]
    if len(members) > 1 and isinstance(value, dict):
        structs = [m for m in members if isinstance(m, msgspec.inspect.StructType)]
        tagged = [m for m in structs if m.tag_field is not None and value.get(m.tag_field) == m.tag]
        members = tagged or (structs if len(structs) == 1 else members)
    elif len(members) > 1 and isinstance(value, str):
        members = [m for m in members if not isinstance(m, msgspec.inspect.StructType)] or members
    return _member(members[0], value) if len(members) == 1 else msgspec.inspect.UnionType(types=tuple(members))


_SEGMENT = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")


def _type_at(path: str, data: Any, *, resolve: bool = True) -> Any:
    """The config type at ``path`` (``$.teams.pay.limits.budget.per``; a map key holding dots is found by trying the
    keys the data has), resolving unions by the data there; None where the path leaves the schema. The tag field of a
    tagged union it cannot resolve (``providers.x.kind: aws-bedrock``) is a LiteralType of the tags."""
    t: Any = msgspec.inspect.type_info(Settings)
    rest, value = path[1:], data
    while rest:
        t = _member(t, value)
        if isinstance(t, msgspec.inspect.DictType) and rest.startswith("."):
            keys = sorted(value, key=len, reverse=True) if isinstance(value, dict) else []
            key = next((k for k in keys if rest[1:] == k or rest[1:].startswith((f"{k}.", f"{k}["))), None)
            if key is None:
                match = _SEGMENT.match(rest)
                key = match.group(1) if match and match.group(1) else rest[1:]
            rest, t = rest[1 + len(key) :], t.value_type
            value = value.get(key) if isinstance(value, dict) else None
            continue
        match = _SEGMENT.match(rest)
        if match is None:
            return None
        rest = rest[match.end() :]
        name, index = match.group(1), match.group(2)
        if name is not None and isinstance(t, msgspec.inspect.StructType):
            field = next((f for f in t.fields if f.encode_name == name), None)
            if field is None:
                return None
            t, value = field.type, value.get(name) if isinstance(value, dict) else None
        elif name is not None and isinstance(t, msgspec.inspect.UnionType):
            tags = [m for m in t.types if isinstance(m, msgspec.inspect.StructType) and m.tag_field == name]
            if not tags or rest:
                return None
            return msgspec.inspect.LiteralType(values=tuple(m.tag for m in tags))
        elif index is not None and isinstance(t, msgspec.inspect.ListType | msgspec.inspect.SetType):
            t = t.item_type
            value = (
                value[int(index)] if isinstance(value, list) and index.isdigit() and int(index) < len(value) else None
            )
        elif index is not None and isinstance(t, msgspec.inspect.DictType):
            t, value = t.value_type, None
        else:
            return None
    return _member(t, value) if resolve else t


_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_WANTED = (
    (msgspec.inspect.IntType, "an integer"),
    (msgspec.inspect.FloatType, "a number"),
    (msgspec.inspect.BoolType, "true or false"),
)


def _coerce(text: Any, t: Any, where: str, template: str) -> Any:
    """An interpolated scalar as the type its field takes: an int, a float or a bool where the field wants one (an
    empty value, where it may be None, is None); text everywhere else. The value is never quoted in an error (it
    came from the environment), the template it filled is."""
    if not isinstance(text, str):
        return text
    t = _bare(t)
    members = list(t.types) if isinstance(t, msgspec.inspect.UnionType) else [t]
    kinds = {type(_bare(m)) for m in members}
    if msgspec.inspect.StrType in kinds or msgspec.inspect.LiteralType in kinds or t is None:
        return text
    if text == "" and msgspec.inspect.NoneType in kinds:
        return None
    lowered = text.strip().lower()
    if msgspec.inspect.BoolType in kinds and lowered in _TRUE | _FALSE:
        return lowered in _TRUE
    if msgspec.inspect.IntType in kinds:
        with contextlib.suppress(ValueError):
            return int(text.strip())
    if msgspec.inspect.FloatType in kinds:
        with contextlib.suppress(ValueError):
            return float(text.strip())
    wanted = " or ".join(name for kind, name in _WANTED if kind in kinds)
    if not wanted:  # a struct, a list…: msgspec says what it expected
        return text
    raise ConfigError(f"{where}: {template} must fill {wanted}, and the environment's value is not")


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\$")


def _interpolate(value: str, env: Mapping[str, str], where: str) -> str:
    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        if name in env and (env[name] or default is None):
            return env[name]
        if default is not None:
            return default
        raise ConfigError(f"{where}: environment variable {name} is not set (use ${{{name}:-default}} for a default)")

    return _VAR.sub(sub, value)


def _to_python(
    node: yaml.Node, path: str, lines: dict[str, int], env: Mapping[str, str], source: str, filled: list[_Filled]
) -> Any:
    lines[path] = node.start_mark.line + 1
    where = f"{source}:{node.start_mark.line + 1}"
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _text(str(key_node.value), f"{source}:{key_node.start_mark.line + 1}")
            if key in out:
                raise ConfigError(f"{source}:{key_node.start_mark.line + 1}: duplicate key {key!r}")
            child = f"{path}.{key}"
            lines[child + "#key"] = key_node.start_mark.line + 1
            out[key] = _to_python(value_node, child, lines, env, source, filled)
            if _interpolated(value_node):
                filled.append((out, key, child, value_node.value))
        return out
    if isinstance(node, yaml.SequenceNode):
        items: list[Any] = []
        for i, item in enumerate(node.value):
            items.append(_to_python(item, f"{path}[{i}]", lines, env, source, filled))
            if _interpolated(item):
                filled.append((items, i, f"{path}[{i}]", item.value))
        return items
    assert isinstance(node, yaml.ScalarNode)
    if node.tag == "tag:yaml.org,2002:str":
        text = _text(node.value, where)
        return _interpolate(text, env, where) if "$" in text else text
    return _construct_scalar(node, env, where)


def _interpolated(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and "${" in str(node.value)


def _text(value: str, where: str) -> str:
    """``value``, refused when a YAML escape made it hold a lone surrogate (``"\\ud800"``): not a character."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{where}: the text holds an escaped surrogate (\\ud800-\\udfff), not a character") from None
    return value


def _construct_scalar(node: yaml.ScalarNode, env: Mapping[str, str], where: str) -> Any:
    loader = yaml.SafeLoader("")
    try:
        value = loader.construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError, LookupError, AttributeError, OverflowError):
        # `!!int abc`, `!!bool maybe`, `!!timestamp x`, an unknown tag…: the value itself is not quoted (it may be
        # a secret read from the environment)
        tag = node.tag.rsplit(":", 1)[-1]
        raise ConfigError(f"{where}: the value is not a valid {tag}") from None
    finally:
        loader.dispose()
    if isinstance(value, str) and "$" in value:
        return _interpolate(value, env, where)
    return value


_PATH = re.compile(r"at `(\$[^`]*)`")
_UNKNOWN = re.compile(r"unknown field `([^`]*)`")


_QUOTED_VALUE = re.compile(r"(Invalid enum value|Invalid value) '[^']*'")


_AT = re.compile(r"\s*-\s*at `\$[^`]*`")


def _locate(message: str, lines: dict[str, int], source: str, data: Any = None) -> str:
    message = _QUOTED_VALUE.sub(r"\1", message)  # name the key and the line, never the value (a secret?)
    match = _PATH.search(message)
    path = match.group(1) if match else "$"
    unknown = _UNKNOWN.search(message)
    if unknown:
        key_path = f"{path}.{unknown.group(1)}"
        line = lines.get(key_path + "#key") or lines.get(path)
        where = _type_at(path, data)
        names = [f.encode_name for f in where.fields] if isinstance(where, msgspec.inspect.StructType) else []
        hint = _did_you_mean(unknown.group(1), names)
        return f"{source}:{line}: unknown key {unknown.group(1)!r} in {_pretty(path)}{hint}"
    line = lines.get(path + "#key") or lines.get(path)
    found = path
    while line is None and "." in found:
        found = found.rsplit(".", 1)[0]
        line = lines.get(found)
    reason = _AT.sub("", message).strip()
    allowed = ""
    if reason.startswith(("Invalid enum value", "Invalid value")):
        t = _type_at(path, data)
        if isinstance(t, msgspec.inspect.LiteralType | msgspec.inspect.EnumType):
            values = t.values if isinstance(t, msgspec.inspect.LiteralType) else [m.value for m in t.cls]
            allowed = f": use one of {', '.join(str(v) for v in values)}"
    return f"{source}:{line or 1}: {reason} at {_pretty(path)}{allowed}"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _pretty(path: str) -> str:
    return path[2:] if path.startswith("$.") else "the top level" if path == "$" else path


def _check_references(settings: Settings, lines: dict[str, int], source: str) -> None:
    for alias, route in settings.models.items():
        for i, target in enumerate(route.targets):
            if target.provider not in settings.providers:
                where = f"$.models.{alias}.targets[{i}]"
                known = ", ".join(sorted(settings.providers)) or "none"
                raise ConfigError(
                    f"{source}:{lines.get(where, 1)}: model {alias!r} targets unknown provider "
                    f"{target.provider!r}{_did_you_mean(target.provider, settings.providers)} (known: {known})"
                )
