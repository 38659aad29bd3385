"""AWS request authentication for the Bedrock family: SigV4 signing and the credentials it signs with.

Credentials come from botocore: explicit keys in the config, or its standard provider chain (environment,
shared config and credentials files with ``profile``, web identity, container and instance roles). The
chain may do network I/O (instance metadata, STS), so it is resolved and refreshed in a worker thread,
one refresh at a time, never on the event loop; a request uses the last frozen credentials and only
waits for a refresh when they are about to expire.

Signing is done here, not with ``botocore.auth.SigV4Auth``: botocore's generic path costs ~230 µs per
request on these machines (URL re-parsing, header copies, a fresh signing-key derivation every time),
which would be a quarter of the gateway's whole CPU budget for a stream. The algorithm is small and
fixed; this implementation caches the day's signing key and the canonical pieces that never change, and
the tests check it against botocore's own signature for every request shape the gateway sends.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import quote, urlsplit

from gateway.settings import AwsAuthSettings
from gateway.wire.errors import GatewayError
from gateway.wire.request import ProxyRequest

from ._http import Auth, HeaderAuth

if TYPE_CHECKING:  # botocore (~13 MB resident) is imported only where its provider chain or a region is needed
    from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials

__all__ = [
    "AwsCredentialsUnavailable",
    "CredentialSource",
    "SigV4Auth",
    "SigV4Signer",
    "StaticCredentials",
    "aws_auth",
    "aws_region",
    "bedrock_api_key",
    "normalize_url_path",
    "sigv4_headers",
]

_ALGORITHM = "AWS4-HMAC-SHA256"
# botocore's SIGNED_HEADERS_BLACKLIST: hop-by-hop headers and those proxies rewrite.
_UNSIGNED = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "x-amzn-trace-id",
        "authorization",
    }
)
_MANDATORY_REFRESH_S = 60  # with less than this left, a request waits for fresh credentials


class StaticCredentials(NamedTuple):
    """Keys from the config, frozen as botocore's ``ReadOnlyCredentials`` is (the same fields), without
    importing botocore: a gateway whose AWS providers all have their keys in the config never loads it."""

    access_key: str
    secret_key: str
    token: str | None


class AwsCredentialsUnavailable(GatewayError):
    """The provider has no usable AWS credentials (a deployment problem, not the client's)."""

    status_code = 500
    error_type = "api_error"
    retryable = True  # another target may be configured with working credentials


class CredentialSource:
    """Frozen AWS credentials for signing, refreshed off the event loop."""

    def __init__(
        self,
        *,
        provider: str,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        profile: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: an already-built botocore credentials object (tests, embedding)."""
        self._provider = provider
        self._profile = profile
        self._frozen: ReadOnlyCredentials | StaticCredentials | None = None  # what requests sign with
        # botocore's credentials that expire and refresh (a role, SSO, a web identity); None: the frozen ones never
        # change (keys from the config or the environment), or none are loaded yet (the chain's, at first use)
        self._refreshable: RefreshableCredentials | None = None
        self._lock: asyncio.Lock | None = None
        self._background: asyncio.Task[None] | None = None
        if access_key_id and secret_access_key:
            self._frozen = StaticCredentials(access_key_id, secret_access_key, session_token)  # botocore not loaded
        elif credentials is not None:
            self._keep(credentials)

    def _keep(self, credentials: Credentials) -> None:
        """Frozen at once if they never change; a refreshable source is frozen by ``_resolve``, in a worker thread
        (freezing it may refresh it: STS, instance metadata)."""
        from botocore.credentials import RefreshableCredentials

        if isinstance(credentials, RefreshableCredentials):
            self._refreshable = credentials
        else:
            self._frozen = credentials.get_frozen_credentials()

    async def get(self) -> ReadOnlyCredentials | StaticCredentials:
        frozen = self._frozen
        if frozen is not None:
            refreshable = self._refreshable
            if refreshable is None:
                return frozen  # nothing ever changes
            if not refreshable.refresh_needed(_MANDATORY_REFRESH_S):
                if refreshable.refresh_needed() and self._background is None:  # advisory: refresh, don't wait
                    self._background = asyncio.get_running_loop().create_task(self._refresh_in_background())
                return frozen
        return await self._refresh()

    async def _refresh(self, within: int | None = _MANDATORY_REFRESH_S) -> ReadOnlyCredentials | StaticCredentials:
        """Fetch fresh credentials in a worker thread, unless another request did so while this one waited
        for the lock (``within``: the seconds-left threshold that asked for it; None = botocore's advisory). What
        another request froze meanwhile is used as it is when it never changes (keys the chain found in the
        environment): the chain is loaded once."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            frozen, refreshable = self._frozen, self._refreshable
            if frozen is not None and (refreshable is None or not refreshable.refresh_needed(within)):
                return frozen
            self._frozen = frozen = await asyncio.to_thread(self._resolve)
            return frozen

    async def _refresh_in_background(self) -> None:
        try:
            await self._refresh(within=None)
        except GatewayError:
            pass  # the current credentials are still valid; the next request tries again
        finally:
            self._background = None

    def _resolve(self) -> ReadOnlyCredentials | StaticCredentials:
        """Runs in a worker thread: the provider chain may call instance metadata or STS (a refreshable source's
        own refresh too, inside ``get_frozen_credentials``)."""
        from botocore.exceptions import BotoCoreError
        from botocore.session import Session

        try:
            if self._refreshable is None:  # the first use: the provider chain's
                credentials = Session(profile=self._profile).get_credentials()
                if credentials is None:
                    raise AwsCredentialsUnavailable(
                        f"provider {self._provider!r}: no AWS credentials found (set keys in the config, a profile, "
                        "the AWS_* environment, or run with a role)"
                    )
                self._keep(credentials)
            if self._refreshable is not None:
                return self._refreshable.get_frozen_credentials()
            assert self._frozen is not None
            return self._frozen
        except BotoCoreError as exc:
            raise AwsCredentialsUnavailable(
                f"provider {self._provider!r}: AWS credentials could not be loaded: {type(exc).__name__}"
            ) from exc


class SigV4Signer:
    """Signs requests to one AWS service in one region (the header-based SigV4 of ``botocore.auth.SigV4Auth``)."""

    def __init__(self, service: str, region: str) -> None:
        self.service = service
        self.region = region
        self._keys: dict[tuple[str, str], bytes] = {}  # (secret, yyyymmdd) -> signing key
        self._paths: dict[str, tuple[str, str, str]] = {}  # url -> (host, canonical path, canonical query)

    def _signing_key(self, secret: str, day: str) -> bytes:
        key = self._keys.get((secret, day))
        if key is None:
            key = _hmac(("AWS4" + secret).encode(), day)
            for part in (self.region, self.service, "aws4_request"):
                key = _hmac(key, part)
            if len(self._keys) > 8:
                self._keys.clear()
            self._keys[(secret, day)] = key
        return key

    def _url_parts(self, url: str) -> tuple[str, str, str]:
        parts = self._paths.get(url)
        if parts is None:
            split = urlsplit(url)
            host = split.hostname or ""
            if split.port is not None and split.port != {"http": 80, "https": 443}.get(split.scheme):
                host = f"{host}:{split.port}"
            path = quote(normalize_url_path(split.path), safe="/~")  # encoded again: %2F -> %252F
            pairs = sorted(item.partition("=")[::2] for item in split.query.split("&") if item)
            query = "&".join(f"{key}={value}" for key, value in pairs)  # as botocore: sent already encoded
            parts = (host, path, query)
            if len(self._paths) > 1024:
                self._paths.clear()
            self._paths[url] = parts
        return parts

    def sign(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        credentials: ReadOnlyCredentials | StaticCredentials,
        *,
        now: float | None = None,
    ) -> dict[str, str]:
        """The headers to send: ``headers`` plus ``x-amz-date``, ``x-amz-security-token`` and ``authorization``."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
        day = stamp[:8]
        host, path, query = self._url_parts(url)
        out = {name.lower(): value for name, value in headers.items()}
        out["x-amz-date"] = stamp
        if credentials.token:
            out["x-amz-security-token"] = credentials.token
        signed = {name: " ".join(value.split()) for name, value in out.items() if name not in _UNSIGNED}
        signed["host"] = host
        names = sorted(signed)
        canonical = "\n".join(
            [
                method,
                path,
                query,
                "".join(f"{name}:{signed[name]}\n" for name in names),
                ";".join(names),
                hashlib.sha256(body).hexdigest(),
            ]
        )
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = f"{_ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(
            self._signing_key(credentials.secret_key or "", day), to_sign.encode(), "sha256"
        ).hexdigest()
        out["authorization"] = (
            f"{_ALGORITHM} Credential={credentials.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return out


def normalize_url_path(path: str) -> str:
    """``botocore.utils.normalize_url_path``: RFC 3986's remove-dot-segments, with empty segments (``//``)
    dropped as AWS requires; "/" for an empty path. Here so signing never imports botocore (tested against it)."""
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment and segment != ".":
            if segment == "..":
                if kept:
                    kept.pop()
            else:
                kept.append(segment)
    first = "/" if path[0] == "/" else ""
    last = "/" if path[-1] == "/" and kept else ""
    return first + "/".join(kept) + last


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), "sha256").digest()


async def sigv4_headers(
    signer: SigV4Signer,
    source: CredentialSource,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
) -> dict[str, str]:
    """Sign with the current credentials. Bodies over 1 MiB are hashed in a worker thread (hashlib releases
    the GIL), so a large PDF upload does not stall every other stream on the loop."""
    credentials = await source.get()
    if len(body) > 1 << 20:
        return await asyncio.to_thread(signer.sign, method, url, headers, body, credentials)
    return signer.sign(method, url, headers, body, credentials)


class SigV4Auth(Auth):
    """SigV4 over each request as it will be sent, with the source's current credentials."""

    __slots__ = ("_signer", "_source")

    def __init__(self, signer: SigV4Signer, source: CredentialSource) -> None:
        self._signer = signer
        self._source = source

    async def apply(self, request: ProxyRequest, url: str, headers: dict[str, str], body: bytes) -> dict[str, str]:
        return await sigv4_headers(self._signer, self._source, "POST", url, headers, body)


def aws_region(configured: str | None, profile: str | None = None) -> str:
    """The configured region, else ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile's, else us-east-1.
    (The last builds a botocore session, ~4 ms: a reload builds its runtime off the event loop.)"""
    if configured:
        return configured
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(var):
            return os.environ[var]
    from botocore.session import Session

    region = Session(profile=profile).get_config_variable("region")
    return region if isinstance(region, str) and region else "us-east-1"


def bedrock_api_key(config: AwsAuthSettings) -> str | None:
    """A Bedrock API key: the configured one, else ``AWS_BEARER_TOKEN_BEDROCK`` when no AWS credentials are
    configured either (as the AWS SDKs and Claude Code read it)."""
    if config.api_key:
        return config.api_key
    if config.access_key_id or config.profile:
        return None
    return os.environ.get("AWS_BEARER_TOKEN_BEDROCK") or None


def aws_auth(name: str, config: AwsAuthSettings, service: str, region: str, *, api_key: str | None) -> Auth:
    """``authorization: Bearer`` with an API key, else SigV4 with the configured keys or botocore's chain."""
    if api_key:
        return HeaderAuth({"authorization": f"Bearer {api_key}"})
    source = CredentialSource(
        provider=name,
        access_key_id=config.access_key_id,
        secret_access_key=config.secret_access_key,
        session_token=config.session_token,
        profile=config.profile,
    )
    return SigV4Auth(SigV4Signer(service, region), source)
