"""SigV4 signing (checked against botocore's own signer) and the credential source's refresh discipline."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters._aws import (
    AwsCredentialsUnavailable,
    CredentialSource,
    SigV4Signer,
    StaticCredentials,
    normalize_url_path,
)

ROOT = Path(__file__).resolve().parents[2]
CREDS = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token-x")


def botocore_signature(
    service: str, region: str, url: str, headers: dict[str, str], body: bytes, creds: Credentials
) -> str:
    """botocore's signature for the request our signer produced (same x-amz-date)."""
    sent = {k: v for k, v in headers.items() if k != "authorization"}
    request = AWSRequest("POST", url, data=body, headers=sent)
    auth = SigV4Auth(creds, service, region)
    request.context["timestamp"] = headers["x-amz-date"]
    return auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)


def signature_of(headers: dict[str, str]) -> str:
    return headers["authorization"].rsplit("Signature=", 1)[1]


URLS = [
    "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-sonnet-4-5-20250929-v1:0/invoke",
    "https://bedrock-runtime.eu-west-1.amazonaws.com/model/eu.anthropic.claude-sonnet-4-6/invoke-with-response-stream",
    "https://bedrock-runtime.us-east-1.amazonaws.com/model/"
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile%2Fabc123/invoke-with-response-stream",
    "http://127.0.0.1:8123/model/us.fake-text/converse-stream",
    "https://bedrock-mantle.us-west-2.api.aws/anthropic/v1/messages?beta=true",
    "https://aws-external-anthropic.us-east-1.api.aws/v1/messages/count_tokens",
    "https://example.com:443/a/./b/../c/invoke",
]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("token", [None, "session-token-x"])
def test_signature_equals_botocore(url: str, token: str | None) -> None:
    creds = Credentials(CREDS.access_key, CREDS.secret_key, token)
    signer = SigV4Signer("bedrock", "us-east-1")
    headers = {
        "Content-Type": "application/json",
        "accept": "application/vnd.amazon.eventstream",
        "x-amzn-bedrock-accept": "application/json",
        "user-agent": "messages-gateway/0.1",  # not signed, as in botocore
        "anthropic-workspace-id": "  wrk  with   spaces ",
    }
    body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}'
    out = signer.sign("POST", url, headers, body, creds.get_frozen_credentials())
    assert signature_of(out) == botocore_signature("bedrock", "us-east-1", url, out, body, creds)
    assert ("x-amz-security-token" in out) == (token is not None)
    assert "user-agent" not in out["authorization"].split("SignedHeaders=")[1]


@settings(max_examples=60, deadline=None)
@given(
    model=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789.-:/_@", min_size=1, max_size=60),
    body=st.binary(max_size=300),
    service=st.sampled_from(["bedrock", "bedrock-mantle", "aws-external-anthropic"]),
    region=st.sampled_from(["us-east-1", "eu-central-1", "ap-northeast-1"]),
)
def test_signature_property(model: str, body: bytes, service: str, region: str) -> None:
    from urllib.parse import quote

    url = f"https://bedrock-runtime.{region}.amazonaws.com/model/{quote(model, safe=':')}/invoke"
    signer = SigV4Signer(service, region)
    out = signer.sign("POST", url, {"content-type": "application/json"}, body, CREDS.get_frozen_credentials())
    assert signature_of(out) == botocore_signature(service, region, url, out, body, CREDS)


@settings(max_examples=400, deadline=None)
@given(path=st.text(alphabet="/.ab%~", max_size=24))
def test_path_normalized_as_botocore_does(path: str) -> None:
    from botocore.utils import normalize_url_path as botocore_normalize

    assert normalize_url_path(path) == botocore_normalize(path)


def test_static_keys_sign_as_botocore_and_never_import_it() -> None:
    """Keys from the config are frozen without botocore (~13 MB a worker): signed the same, and a process that
    only signs with them never imports it."""
    frozen = asyncio.run(
        CredentialSource(
            provider="p", access_key_id=CREDS.access_key, secret_access_key=CREDS.secret_key, session_token=CREDS.token
        ).get()
    )
    assert isinstance(frozen, StaticCredentials) and tuple(frozen) == tuple(CREDS.get_frozen_credentials())[:3]
    source = CredentialSource(provider="p", access_key_id="AK", secret_access_key="SK")
    assert asyncio.run(source._refresh()) == StaticCredentials("AK", "SK", None)  # never botocore's chain
    url = URLS[2]
    out = SigV4Signer("bedrock", "us-east-1").sign("POST", url, {"a": "b"}, b"{}", frozen)
    assert signature_of(out) == botocore_signature("bedrock", "us-east-1", url, out, b"{}", CREDS)
    code = (
        "import asyncio, sys\n"
        "from adapters._aws import CredentialSource, SigV4Signer, sigv4_headers\n"
        "source = CredentialSource(provider='p', access_key_id='AK', secret_access_key='SK')\n"
        f"asyncio.run(sigv4_headers(SigV4Signer('bedrock', 'us-east-1'), source, 'POST', {url!r}, {{}}, b'x'))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'botocore'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.strip() == "[]"


def test_signing_key_cached_per_day() -> None:
    signer = SigV4Signer("bedrock", "us-east-1")
    frozen = CREDS.get_frozen_credentials()
    url = URLS[0]
    day1 = signer.sign("POST", url, {}, b"", frozen, now=1_700_000_000)
    day2 = signer.sign("POST", url, {}, b"", frozen, now=1_700_000_000 + 86_400)
    assert day1["x-amz-date"][:8] != day2["x-amz-date"][:8]
    for out in (day1, day2):
        assert signature_of(out) == botocore_signature("bedrock", "us-east-1", url, out, b"", CREDS)


def test_large_body_signed_in_a_thread() -> None:
    from adapters._aws import sigv4_headers

    seen: list[str] = []

    class Spy(SigV4Signer):
        def sign(self, *args: object, **kwargs: object) -> dict[str, str]:  # type: ignore[override]
            seen.append(threading.current_thread().name)
            return super().sign(*args, **kwargs)  # type: ignore[arg-type]

    async def main() -> None:
        source = CredentialSource(provider="p", access_key_id="AK", secret_access_key="SK")
        signer = Spy("bedrock", "us-east-1")
        await sigv4_headers(signer, source, "POST", URLS[0], {}, b"x" * 100)
        await sigv4_headers(signer, source, "POST", URLS[0], {}, b"x" * (2 << 20))

    asyncio.run(main())
    assert seen[0] == "MainThread" and seen[1] != "MainThread"


# --- credentials -------------------------------------------------------------------------------------------


def _refreshable(
    expires_in: float, calls: list[float], *, then: float = 3600, delay: float = 0.05
) -> RefreshableCredentials:
    def refresh() -> dict[str, str]:
        calls.append(time.monotonic())
        time.sleep(delay)  # a slow STS / metadata call
        expiry = datetime.now(UTC) + timedelta(seconds=then)
        return {
            "access_key": f"AK{len(calls)}",
            "secret_key": "SK",
            "token": f"T{len(calls)}",
            "expiry_time": expiry.isoformat(),
        }

    metadata = {
        "access_key": "AK0",
        "secret_key": "SK",
        "token": "T0",
        "expiry_time": (datetime.now(UTC) + timedelta(seconds=expires_in)).isoformat(),
    }
    return RefreshableCredentials.create_from_metadata(metadata, refresh, "test")


def test_one_refresh_for_many_concurrent_requests_near_expiry() -> None:
    calls: list[float] = []

    async def main() -> set[str]:
        source = CredentialSource(provider="p", credentials=_refreshable(5, calls))
        got = await asyncio.gather(*(source.get() for _ in range(50)))
        return {c.access_key for c in got}

    keys = asyncio.run(main())
    assert len(calls) == 1
    assert keys == {"AK1"}


def test_advisory_refresh_happens_in_the_background() -> None:
    calls: list[float] = []

    async def main() -> tuple[str, str]:
        # 12 minutes left: botocore's advisory window (15 min) but well before expiry
        source = CredentialSource(provider="p", credentials=_refreshable(720, calls))
        # as if these were fetched 48 minutes ago and time has moved on into the advisory window
        source._frozen = ReadOnlyCredentials("AK0", "SK", "T0")
        first = await source.get()  # does not wait for the refresh
        for _ in range(500):  # until the background refresh has happened (at most 5 s)
            if calls and source._frozen is not None and source._frozen.access_key != "AK0":
                break
            await asyncio.sleep(0.01)
        second = await source.get()
        return first.access_key, second.access_key

    first, second = asyncio.run(main())
    assert first == "AK0"
    assert second == "AK1"
    assert len(calls) == 1


def test_credentials_from_a_profile_in_the_shared_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "credentials").write_text(
        "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s1\n"
        "[team]\naws_access_key_id = AKTEAM\naws_secret_access_key = s2\naws_session_token = tok\n"
    )
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))

    async def main() -> tuple[str, str, str | None]:
        default = await CredentialSource(provider="p").get()
        team = await CredentialSource(provider="p", profile="team").get()
        return default.access_key, team.access_key, team.token

    assert asyncio.run(main()) == ("AKDEFAULT", "AKTEAM", "tok")


def test_credentials_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "senv")
    assert asyncio.run(CredentialSource(provider="p").get()).access_key == "AKENV"


def test_the_chain_is_loaded_once_for_many_concurrent_first_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys from the environment come through botocore's chain as credentials that never change: the requests that
    waited for the first load use what it froze, without loading the chain again each in turn."""
    from botocore.session import Session

    _isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKENV")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "senv")
    loads: list[str] = []
    real = Session.get_credentials

    def counted(self: Session) -> object:
        loads.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(Session, "get_credentials", counted)

    async def main() -> set[str]:
        source = CredentialSource(provider="p")
        got = await asyncio.gather(*(source.get() for _ in range(20)))
        got.append(await source.get())
        return {c.access_key for c in got}

    assert asyncio.run(main()) == {"AKENV"}
    assert len(loads) == 1 and loads[0] != "MainThread"


def test_no_credentials_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _isolate(monkeypatch, tmp_path)
    with pytest.raises(AwsCredentialsUnavailable, match="no AWS credentials found") as info:
        asyncio.run(CredentialSource(provider="bedrock-prod").get())
    assert info.value.status_code == 500 and "bedrock-prod" in info.value.message


def _isolate(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "missing-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "missing-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
