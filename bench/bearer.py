"""What checking a client's credential costs per request, in the gateway's own ``Identity.authenticate``: a config
key (a digest look-up), an identity provider's JWT already verified once (``auth.jwt``'s cache), and a bearer that
Claude Code's ``/login`` minted, already seen once (``gateway.governance.sessions``).

    .venv/bin/python -m bench.bearer [--rounds 200000]

Each figure is the median of 5 runs of ``rounds`` checks, CPU time per check, in one process; the ratios are what to
read (this machine is noisy).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gateway.governance.identity import Identity
from gateway.governance.keys import build_keys, digest_of
from gateway.governance.sessions import Sessions
from gateway.governance.signin import SignIn, sha
from gateway.governance.signin_store import MemorySigninStore, UserInfo
from gateway.settings import parse_settings
from tests.jwt_issuer import AUDIENCE, LocalIssuer


class _Runtime:
    def __init__(self, yaml: str) -> None:
        self.settings = parse_settings(yaml, environ={})
        self.key_index = {k.digest: k for k in build_keys(self.settings.auth.keys, self.settings.teams)}


async def _per_check(identity: Identity, runtime: _Runtime, headers: dict[str, str], rounds: int) -> float:
    await identity.authenticate(runtime, headers)  # the first check verifies; the rest are what is measured
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(rounds):
            await identity.authenticate(runtime, headers)
        runs.append((time.process_time() - start) / rounds * 1e6)
    return statistics.median(runs)


async def main(rounds: int) -> None:
    issuer = LocalIssuer()
    try:
        teams = "teams: {pay: {}, eng: {}}"
        key_rt = _Runtime(f"auth: {{keys: [{{name: ci, key: sk-ci, team: pay}}]}}\n{teams}")
        jwt_rt = _Runtime(
            f"auth: {{jwt: {{issuer: '{issuer.url}', audience: '{AUDIENCE}', user_claim: email, team_claim: groups}}}}"
            f"\n{teams}"
        )
        login_rt = _Runtime(
            "auth: {keys: [sk-x]}\n"
            f"{teams}\n"
            "login: {public_url: 'https://gw.example.com', oidc: {issuer: 'https://idp.example.com', client_id: gw}}"
        )
        store = MemorySigninStore()

        async def opened() -> MemorySigninStore:
            return store

        sessions = Sessions(opened)
        assert login_rt.settings.login is not None
        signin = SignIn(login_rt.settings.login, opened, sessions)
        started = await signin.start("claude_code", "127.0.0.1")
        now = int(time.time() * 1000)
        digest = sha(started["device_code"])
        await store.begin(digest, state="s", nonce="n", code_verifier="v", browser_sha256="b", now_ms=now)
        user = UserInfo(subject="u-1", email="alice@example.com", name="Alice", groups=["pay"])
        await store.finish(digest, user, now)
        grant = {"grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": started["device_code"]}
        bearer = (await signin.token(grant))["access_token"]

        figures = {
            "config key (x-api-key)": await _per_check(Identity(None), key_rt, {"x-api-key": "sk-ci"}, rounds),
            "auth.jwt token, cached": await _per_check(
                Identity(None), jwt_rt, {"authorization": f"Bearer {issuer.token()}"}, rounds
            ),
            "/login bearer, cached": await _per_check(
                Identity(None, sessions), login_rt, {"authorization": f"Bearer {bearer}"}, rounds
            ),
        }
        assert digest_of("sk-ci")
    finally:
        issuer.close()
    base = figures["auth.jwt token, cached"]
    print(f"{'credential':28} {'µs/check':>9} {'vs cached JWT':>14}")
    for name, value in figures.items():
        print(f"{name:28} {value:9.2f} {value / base:13.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200_000)
    asyncio.run(main(parser.parse_args().rounds))
