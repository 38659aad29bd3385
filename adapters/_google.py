"""Google OAuth2 access tokens for Vertex AI, through google-auth.

Credentials: a file named in the config (service account, external account / workload identity
federation, authorized user) or Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
gcloud's ADC file, the metadata server). google-auth's refresh is blocking I/O, so it runs in a worker
thread; an ``asyncio.Lock`` makes it one refresh at a time however many requests wait, and a request
only waits when the token is missing or inside google-auth's refresh window (3 min 45 s before expiry),
i.e. tokens are replaced before they expire. ``refresh_after_401`` forces one new token when the provider
rejects the current one (revoked, clock skew), without a refresh storm: only the first request that saw
that token refreshes.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from typing import Any

from gateway.wire.errors import GatewayError

__all__ = ["CLOUD_PLATFORM", "GoogleCredentialsUnavailable", "GoogleTokenSource"]

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


class GoogleCredentialsUnavailable(GatewayError):
    """No usable Google credentials (a deployment problem, not the client's)."""

    status_code = 500
    error_type = "api_error"
    retryable = True


class GoogleTokenSource:
    def __init__(self, *, provider: str, credentials_file: str | None = None, project: str | None = None) -> None:
        self._provider = provider
        self._file = credentials_file
        self._project = project
        self._credentials: Any = None
        self._request: Any = None
        self._lock: asyncio.Lock | None = None
        self.refreshes = 0

    @property
    def project(self) -> str | None:
        return self._project

    async def token(self) -> str:
        credentials = self._credentials
        if credentials is not None and credentials.valid and credentials.token:
            return str(credentials.token)
        return await self._refresh(stale=None)

    async def refresh_after_401(self, rejected: str) -> str:
        return await self._refresh(stale=rejected)

    async def _refresh(self, *, stale: str | None) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            credentials = self._credentials
            fresh = credentials is not None and credentials.valid and credentials.token
            if fresh and (stale is None or credentials.token != stale):
                return str(credentials.token)  # refreshed by another request while this one waited
            token = await asyncio.to_thread(self._refresh_blocking)
            self.refreshes += 1
            return token

    def _refresh_blocking(self) -> str:
        """In a worker thread: load the credentials once, then fetch a token (network I/O)."""
        import google.auth
        import google.auth.exceptions
        import google.auth.transport.requests

        try:
            if self._credentials is None:
                if self._file:
                    # The operator's own file, trusted as GOOGLE_APPLICATION_CREDENTIALS is: google-auth's
                    # generic loader (every credential type) with the warning it silences for ADC itself.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", DeprecationWarning)
                        credentials, project = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
                            self._file, scopes=[CLOUD_PLATFORM]
                        )
                else:
                    credentials, project = google.auth.default(scopes=[CLOUD_PLATFORM])
                self._credentials = credentials
                if not self._project:
                    self._project = (
                        os.environ.get("ANTHROPIC_VERTEX_PROJECT_ID")
                        or os.environ.get("GOOGLE_CLOUD_PROJECT")
                        or project
                    )
                self._request = google.auth.transport.requests.Request()
            self._credentials.refresh(self._request)
        except google.auth.exceptions.GoogleAuthError as exc:
            raise GoogleCredentialsUnavailable(
                f"provider {self._provider!r}: Google credentials could not be used: {type(exc).__name__}: "
                f"{str(exc)[:200]}"
            ) from exc
        token = self._credentials.token
        if not token:
            raise GoogleCredentialsUnavailable(f"provider {self._provider!r}: Google returned no access token")
        return str(token)
