"""Microsoft Entra ID access tokens for Foundry, through azure-identity's async credentials.

With ``client_secret`` in the config: that app registration (``ClientSecretCredential``). Otherwise
azure-identity's ``DefaultAzureCredential`` chain: environment (``AZURE_CLIENT_ID`` / ``AZURE_TENANT_ID`` /
``AZURE_CLIENT_SECRET`` or a certificate), workload identity (AKS), managed identity (``client_id`` picks a
user-assigned one), Azure CLI. Tokens are cached until five minutes before they expire and fetched one at a
time however many requests wait.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gateway.settings import EntraSettings
from gateway.wire.errors import GatewayError

__all__ = ["EntraTokenSource", "EntraUnavailable"]

_EARLY_S = 300  # renew this long before expiry


class EntraUnavailable(GatewayError):
    status_code = 500
    error_type = "api_error"
    retryable = True


class EntraTokenSource:
    def __init__(self, *, provider: str, settings: EntraSettings, credential: Any = None) -> None:
        """``credential``: an azure-identity async credential to use instead of the one the settings name."""
        self._provider = provider
        self._settings = settings
        self._credential = credential
        self._token = ""
        self._expires_on = 0.0
        self._lock: asyncio.Lock | None = None
        self.fetches = 0

    def _build(self) -> Any:
        from azure.identity.aio import ClientSecretCredential, DefaultAzureCredential

        s = self._settings
        extra: dict[str, Any] = {"authority": s.authority} if s.authority else {}
        if s.ca_file:
            extra["connection_verify"] = s.ca_file
        if s.client_secret and s.tenant_id and s.client_id:
            return ClientSecretCredential(s.tenant_id, s.client_id, s.client_secret, **extra)
        if s.client_id:
            extra["managed_identity_client_id"] = s.client_id
            extra["workload_identity_client_id"] = s.client_id
        if s.tenant_id:
            extra["workload_identity_tenant_id"] = s.tenant_id
        return DefaultAzureCredential(**extra)

    async def token(self) -> str:
        if self._token and time.time() < self._expires_on - _EARLY_S:
            return self._token
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._token and time.time() < self._expires_on - _EARLY_S:
                return self._token
            if self._credential is None:
                self._credential = self._build()
            try:
                access = await self._credential.get_token(self._settings.scope)
            except Exception as exc:  # azure-identity raises ClientAuthenticationError and friends
                raise EntraUnavailable(
                    f"provider {self._provider!r}: no Entra ID token: {type(exc).__name__}: {str(exc)[:200]}"
                ) from exc
            self.fetches += 1
            self._token, self._expires_on = access.token, float(access.expires_on)
            return self._token

    async def aclose(self) -> None:
        if self._credential is not None:
            await self._credential.close()
