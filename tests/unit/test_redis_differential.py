"""The gateway's Redis client (``gateway.governance.redis_client``) against a real ``redis-server``, side by side with
redis-py's asyncio client (``redis.asyncio.Redis``) where the case applies (issue 37, the differential suite: Redis).

Each case asserts what our client must do, and records what redis-py does with the same traffic (the report's
``user_properties``, ``redis_py``), for comparison: where redis-py does worse, a comment says so.

1. The server SIGKILLed under 40 looping callers: every call under way fails at once (``RedisUnavailable``), none
   hangs or gets another's reply; a new server on the same port (its data and scripts gone) is used again after the
   back-off, each caller getting the answer to its own command.
2. ``SCRIPT FLUSH`` from another connection while 20 callers admit through the limiter's script: each ``NOSCRIPT``
   is answered by sending the script (``EVAL``) on the same connection; no caller sees an error, and each admission
   is counted once.
3. Calls that time out (``DEBUG SLEEP`` / ``CLIENT PAUSE`` from another connection): they fail, and the replies the
   server sends late never reach later calls.
4. An ACL user with only what the limiter needs: the limiter works; a wrong password fails at once, saying so; a
   command or key the user is not allowed is a ``ReplyError`` and the connection goes on.
5. 1000 calls at once with 10 KB values, their replies split across many reads: each caller gets its own.

Servers are Debian's ``redis-server`` on 127.0.0.1 (``tests/redis_server.py``), private to this module: the cases
kill, pause and flush them."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions
import uvloop

from gateway.governance import redis_client
from gateway.governance.limits import _ADMIT, CountersError, RedisCounters
from gateway.governance.redis_client import RedisClient, RedisUnavailable, ReplyError, Script
from tests.redis_server import RedisServer, start_redis


def _need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_REDIS"):
            pytest.fail("redis-server is required here (MESSAGES_GATEWAY_REQUIRE_REDIS) but not installed")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """One ``redis-server`` for the module's cases that do not kill it; ``DEBUG`` allowed from 127.0.0.1 (Redis 7
    refuses it by default)."""
    _need_redis_server()
    started = start_redis("--enable-debug-command", "local")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def doomed() -> Iterator[RedisServer]:
    """A ``redis-server`` of the case's own: it is killed and started again."""
    _need_redis_server()
    started = start_redis()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[[str, object], None]:
    """Keeps a finding on the test's report (``user_properties``), as ``record_property`` does but without its
    warning under ``--junitxml``'s default xunit2 (warnings are errors here)."""

    def keep(name: str, value: object) -> None:
        request.node.user_properties.append((name, value))

    return keep


def _redis_py(url: str, timeout: float, **options: Any) -> redis.asyncio.Redis:
    """redis-py's asyncio client as one would configure it for the limiter: the same timeout for a connect and a
    reply; its own defaults otherwise (a pool, ``Retry`` of 10 attempts with jittered back-off)."""
    return redis.asyncio.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout, **options)


# A script of the test's: the caller's own token back, with the count of its key (which tells a new server's
# empty data from the old one's).
_TOKEN_AND_COUNT = "return {ARGV[1], redis.call('INCR', KEYS[1])}"


@dataclass
class _Traffic:
    """What callers saw: each call's (caller, asked at, settled at, outcome); outcome ``"own"`` (the reply to its own
    command), ``"other"`` (another's), or the exception's class name."""

    calls: list[tuple[int, float, float, str]] = field(default_factory=list)
    other: list[tuple[Any, Any]] = field(default_factory=list)
    counts: dict[int, list[tuple[float, int]]] = field(default_factory=dict)  # each EVALSHA caller's (asked, count)

    def outcomes(self, since: float = 0.0, until: float = float("inf")) -> set[str]:
        return {outcome for _, asked, _, outcome in self.calls if since <= asked < until}

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for _, _, _, outcome in self.calls:
            kinds[outcome] = kinds.get(outcome, 0) + 1
        return {"outcomes": kinds, "longest_call_s": round(max(s - a for _, a, s, _ in self.calls), 3)}


# One caller's command: (ECHO or EVALSHA) with its token → the reply.
_Ask = Callable[[int, bytes], Awaitable[Any]]


def _ours_asks(client: RedisClient) -> _Ask:
    script = Script(_TOKEN_AND_COUNT)

    def ask(i: int, token: bytes) -> Awaitable[Any]:
        if i % 2:
            return client.call("ECHO", token)
        return client.evalsha(script, [f"count:{i}"], [token])

    return ask


def _redis_py_asks(client: redis.asyncio.Redis) -> _Ask:
    script = client.register_script(_TOKEN_AND_COUNT)

    def ask(i: int, token: bytes) -> Awaitable[Any]:
        if i % 2:
            return client.echo(token)
        return script(keys=[f"count:{i}"], args=[token])

    return ask


async def _callers(ask: _Ask, n: int, traffic: _Traffic, stop: asyncio.Event, cap: float) -> None:
    """``n`` callers asking without a pause (10 ms after a failure) until ``stop``; a call not settled within
    ``cap`` seconds is recorded as ``hung`` (and cancelled)."""

    async def caller(i: int) -> None:
        if not i % 2:
            traffic.counts[i] = []
        k = 0
        while not stop.is_set():
            k += 1
            token = f"{i}-{k}".encode()
            asked = time.monotonic()  # (uvloop's loop.time() is the iteration's, in ms)
            try:
                reply = await asyncio.wait_for(ask(i, token), cap)
            except TimeoutError:
                outcome = "hung"
            except Exception as exc:
                outcome = type(exc).__name__
            else:
                mine = reply == token if i % 2 else isinstance(reply, list) and reply[0] == token
                outcome = "own" if mine else "other"
                if not mine:
                    traffic.other.append((token, reply))
                elif not i % 2:
                    traffic.counts[i].append((asked, reply[1]))
            traffic.calls.append((i, asked, time.monotonic(), outcome))
            if outcome != "own":
                await asyncio.sleep(0.01)

    await asyncio.gather(*(caller(i) for i in range(n)))


# -- 1. SIGKILL under traffic -------------------------------------------------------------------------------------


async def _through_a_kill(doomed: RedisServer, ask: _Ask) -> tuple[_Traffic, float, float, float]:
    """40 callers for 0.4 s, the server SIGKILLed, 0.4 s down, started again on the same port, 1.5 s more (the
    longest back-off is 1 s). Returns the traffic, and the times (``time.monotonic``) of the kill, of the old
    server's death (its process reaped) and of the new server seen answering by the test (the callers may see it
    first: the start's thread waits for the GIL and the loop on a busy machine)."""
    traffic, stop = _Traffic(), asyncio.Event()
    callers = asyncio.ensure_future(_callers(ask, 40, traffic, stop, cap=5.0))
    await asyncio.sleep(0.4)
    assert doomed.proc is not None
    killed = time.monotonic()
    doomed.proc.kill()
    await asyncio.to_thread(doomed.proc.wait)
    dead = time.monotonic()
    await asyncio.sleep(0.4)
    await asyncio.to_thread(doomed.start)  # (it waits for a PONG: not on the loop)
    back = time.monotonic()
    await asyncio.sleep(1.5)
    stop.set()
    await callers
    return traffic, killed, dead, back


def test_sigkill_in_flight_fails_every_pending_call_at_once_and_a_new_server_is_used_again(
    doomed: RedisServer, record: Callable[[str, object], None]
) -> None:
    timeout = 1.0

    async def ours() -> tuple[_Traffic, float, float, float]:
        client = RedisClient(doomed.url, timeout=timeout)
        try:
            return await _through_a_kill(doomed, _ours_asks(client))
        finally:
            await client.aclose()

    traffic, killed, dead, back = uvloop.run(ours())
    record("ours", traffic.summary())
    assert not traffic.other, traffic.other[:5]  # nobody got another caller's reply
    assert traffic.outcomes() == {"own", "RedisUnavailable"}, traffic.summary()  # no hang, no other error
    # the calls under way when the kill was sent: answered (before the server died) or failed, at once (the
    # connection's loss is seen, not waited out by the timer)
    under_way = [(s, o) for _, a, s, o in traffic.calls if a < killed < s]
    assert len(under_way) >= 20, (len(under_way), traffic.summary())
    assert max(settled - killed for settled, _ in under_way) < timeout / 2, under_way
    failed = [s for _, a, s, o in traffic.calls if a < back and o == "RedisUnavailable"]
    assert len(failed) >= 20 and min(failed) - killed < timeout / 2, traffic.summary()
    assert max(s - a for _, a, s, _ in traffic.calls) < timeout + 0.2  # nothing waited past the timeout
    # back after the back-off (at most 1 s, jittered) and every caller answered again, with its own reply
    assert traffic.outcomes(back + 1.0) == {"own"}, traffic.summary()
    for i in range(0, 40, 2):  # the new server's data is empty: counts begin again at 1
        counts = traffic.counts[i]
        before = [n for asked, n in counts if asked < killed]
        # every count asked once the old server was gone is the new one's (not only those asked after the test's
        # own PING came back: under load the callers reach the new server tens of calls before that)
        after = [n for asked, n in counts if asked > dead]
        assert before[0] == 1 and after[0] == 1 and after == list(range(1, len(after) + 1)), (i, counts)

    # redis-py, the same traffic: no reply misrouted either, and a call under way fails with ConnectionError at
    # once; but it does worse while the server is down: each call is retried (Retry: 10 attempts, 10 ms .. 1 s
    # back-off), so it fails ~0.15 s after it was asked where ours fails at once (the limiter's on_store_error then
    # waits with it); and with one connection per concurrent caller it answered ~6 times fewer calls in one run
    async def theirs() -> tuple[_Traffic, float, float, float]:
        client = _redis_py(doomed.url, timeout)
        try:
            return await _through_a_kill(doomed, _redis_py_asks(client))
        finally:
            await client.aclose()

    traffic, killed, _, _ = asyncio.run(theirs())
    slowest = max((s - killed for _, a, s, _ in traffic.calls if a < killed < s), default=0.0)
    record(
        "redis_py",
        {
            **traffic.summary(),
            "other_replies": len(traffic.other),
            "slowest_failure_after_kill_s": round(slowest, 3),
        },
    )


# -- 2. SCRIPT FLUSH under concurrency ------------------------------------------------------------------------------


async def _admits_through_flushes(
    admit: Callable[[int], Awaitable[Any]], flush: Callable[[], Awaitable[Any]]
) -> tuple[dict[int, int], list[BaseException]]:
    """20 callers admitting in a loop for 0.6 s while the scripts are flushed every 50 ms; returns each caller's
    successful admissions and the errors seen."""
    done: dict[int, int] = {}
    errors: list[BaseException] = []
    stop = asyncio.Event()

    async def caller(i: int) -> None:
        done[i] = 0
        while not stop.is_set():
            try:
                await admit(i)
                done[i] += 1
            except Exception as exc:
                errors.append(exc)
                await asyncio.sleep(0.005)

    callers = asyncio.ensure_future(asyncio.gather(*(caller(i) for i in range(20))))
    for _ in range(12):
        await asyncio.sleep(0.05)
        await flush()
    stop.set()
    await callers
    return done, errors


def test_script_flush_under_concurrent_evalsha_falls_back_to_eval_and_no_caller_sees_it(
    server: RedisServer, record: Callable[[str, object], None]
) -> None:
    async def ours() -> None:
        admin = RedisClient(server.url)
        counters = RedisCounters(server.url, prefix="flush-ours:")
        assert await counters.admit([], [("warm", 1.0, 60)]) == (-1, [])  # loaded (NOSCRIPT → EVAL) and used
        flushes = 0
        sent_before = await _command_calls(admin)

        async def flush() -> None:
            nonlocal flushes
            assert await admin.call("SCRIPT", "FLUSH") == b"OK"
            flushes += 1

        done, errors = await _admits_through_flushes(
            lambda i: counters.admit([(f"k{i}", 1e9)], [(f"k{i}", 1.0, 60)]), flush
        )
        assert not errors, errors[:3]
        assert sum(done.values()) > 200, done
        # each admission counted once: an EVAL sent after a NOSCRIPT is not an admission run twice
        assert await counters.read([f"k{i}" for i in range(20)]) == [float(done[i]) for i in range(20)]
        sent = {name: n - sent_before.get(name, 0) for name, n in (await _command_calls(admin)).items()}
        assert 1 <= sent.get("eval", 0) <= 20 * flushes, sent  # at most one EVAL per caller per flush
        assert "script|load" not in sent  # the script goes with the EVAL: no round trip of its own
        await counters.aclose()
        await admin.aclose()

    uvloop.run(ours())

    # redis-py's Script: EVALSHA; on NOSCRIPT, SCRIPT LOAD then EVALSHA again, each its own round trip on a
    # connection of the pool (two more round trips where ours has one). A flush between its SCRIPT LOAD and its
    # EVALSHA would reach the caller as NoScriptError (a window of one round trip: not seen in our runs, where its
    # callers saw no error and each admission was counted once); and it needs +script (the ACL cases below).
    async def theirs() -> dict[str, Any]:
        admin = _redis_py(server.url, 1.0)
        client = _redis_py(server.url, 1.0)
        script = client.register_script(_ADMIT)
        await script(keys=["flush-theirs:warm"], args=[0, 1, 60])

        async def flush() -> None:
            await admin.script_flush()

        done, errors = await _admits_through_flushes(
            lambda i: script(keys=[f"flush-theirs:k{i}"] * 2, args=[1, 1e9, 1, 60]), flush
        )
        counted = [float(v or 0) for v in await client.mget([f"flush-theirs:k{i}" for i in range(20)])]
        await client.aclose()
        await admin.aclose()
        return {
            "admissions": sum(done.values()),
            "errors": sorted({type(e).__name__ for e in errors}),
            "n_errors": len(errors),
            "counted_once": counted == [float(done[i]) for i in range(20)],
        }

    outcome = asyncio.run(theirs())
    record("redis_py", outcome)


async def _command_calls(client: RedisClient) -> dict[str, int]:
    stats = (await client.call("INFO", "commandstats")).decode()
    out = {}
    for line in stats.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_") :].split(":", 1)
            out[name] = int(rest.split("calls=")[1].split(",")[0])
    return out


# -- 3. replies that come after their calls timed out ---------------------------------------------------------------


@dataclass
class _Stalled:
    """Calls asked while the server stalls: (token, asked, settled, reply or exception), by ``time.monotonic``."""

    calls: list[tuple[bytes, float, float, Any]]
    stalled_until: float

    def outcome(self, token: bytes, result: Any) -> str:
        if isinstance(result, BaseException):
            return type(result).__name__
        return "own" if result == token else "other"

    def outcomes(self, since: float = 0.0) -> dict[str, int]:
        out: dict[str, int] = {}
        for token, asked, _, result in self.calls:
            if asked >= since:
                kind = self.outcome(token, result)
                out[kind] = out.get(kind, 0) + 1
        return out


async def _through_a_stall(stall: Callable[[], Awaitable[Any]], ask: Callable[[bytes], Awaitable[Any]]) -> _Stalled:
    """The server stalled for 1.5 s by ``stall`` (another connection's): 10 calls at once just after it began, then
    one every 50 ms until 0.8 s after it ended; each call's ``ECHO <its own token>``."""
    assert await ask(b"warm") == b"warm"
    stalling = asyncio.ensure_future(stall())
    began = time.monotonic()
    await asyncio.sleep(0.05)  # the server asleep (or pausing clients)
    calls: list[tuple[bytes, float, float, Any]] = []

    async def one(token: bytes) -> None:
        asked = time.monotonic()
        try:
            result: Any = await asyncio.wait_for(ask(token), 5.0)  # (a hang would be a TimeoutError)
        except Exception as exc:
            result = exc
        calls.append((token, asked, time.monotonic(), result))

    tasks = [asyncio.ensure_future(one(b"first-%d" % i)) for i in range(10)]
    k = 0
    while time.monotonic() < began + 1.5 + 0.8:
        await asyncio.sleep(0.05)
        k += 1
        tasks.append(asyncio.ensure_future(one(b"later-%d" % k)))
    await asyncio.gather(*tasks)
    await stalling
    return _Stalled(calls, began + 1.5)


def _stall(how: str, url: str) -> Callable[[], Awaitable[Any]]:
    async def stall() -> None:
        admin = RedisClient(url, timeout=5.0)
        if how == "DEBUG SLEEP":
            assert await admin.call("DEBUG", "SLEEP", "1.5") == b"OK"  # the whole server asleep
        else:
            assert await admin.call("CLIENT", "PAUSE", "1500", "ALL") == b"OK"  # every client's commands held
        await admin.aclose()

    return stall


@pytest.mark.parametrize("how", ["DEBUG SLEEP", "CLIENT PAUSE"])
def test_replies_that_come_after_their_calls_timed_out_reach_no_later_call(
    server: RedisServer, how: str, record: Callable[[str, object], None]
) -> None:
    timeout = 0.5

    async def ours() -> _Stalled:
        client = RedisClient(server.url, timeout=timeout)
        try:
            return await _through_a_stall(_stall(how, server.url), lambda token: client.call("ECHO", token))
        finally:
            await client.aclose()

    got = uvloop.run(ours())
    record("ours", got.outcomes())
    for token, asked, settled, result in got.calls:
        assert got.outcome(token, result) in ("own", "RedisUnavailable"), (token, result)  # never another's
        assert settled - asked < timeout + 0.25, (token, settled - asked)  # failed by the timeout, not later
        if token.startswith(b"first-"):
            assert isinstance(result, RedisUnavailable) and "no answer from Redis within 0.5 s" in str(result)
    # and answered again once the server is (the back-off after the connects it left unanswered is over)
    assert got.outcomes(since=got.stalled_until + 0.3) == {"own": pytest.approx(10, abs=4)}, got.outcomes()

    # redis-py: its own socket_timeout (TimeoutError, the connection dropped), and a caller's own deadline
    # (asyncio.wait_for cancels the call: the connection is dropped too since redis-py 4.5.4, CVE-2023-28858/9).
    # As ours: no late reply reached another call, in either.
    async def theirs(options: dict[str, Any], deadline: float | None) -> _Stalled:
        client = redis.asyncio.Redis.from_url(server.url, **options)

        async def ask(token: bytes) -> Any:
            return await (client.echo(token) if deadline is None else asyncio.wait_for(client.echo(token), deadline))

        try:
            return await _through_a_stall(_stall(how, server.url), ask)
        finally:
            await client.aclose()

    seen = {"socket_timeout": asyncio.run(theirs({"socket_timeout": timeout}, None)).outcomes()}
    if how == "DEBUG SLEEP":
        seen["wait_for"] = asyncio.run(theirs({}, timeout)).outcomes()
    record("redis_py", seen)


def test_a_connect_whose_set_up_goes_unanswered_is_a_failed_connect_and_backed_off(
    server: RedisServer, record: Callable[[str, object], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that takes connections but answers nothing (asleep: a long script, a stalled disk; or a proxy whose
    Redis is gone). A call that times out on a connection that was answering drops it, and the next call connects
    again at once; but a connect whose set-up (``INFO cluster``) goes unanswered for ``timeout`` has failed as one
    refused has (module docstring): the calls after it fail at once for the back-off, not ``timeout`` each."""
    timeout = 0.3
    monkeypatch.setattr(redis_client, "_RETRY_FIRST", 0.4)  # a back-off (0.2 .. 0.4 s) no slow loop turn outlasts

    async def ask(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
        began = time.monotonic()
        try:
            result: Any = await asyncio.wait_for(call(), 5.0)
        except Exception as exc:
            result = exc
        return time.monotonic() - began, result

    async def through(call: Callable[[], Awaitable[Any]]) -> list[tuple[float, Any]]:
        assert await call() == b"x"  # connected
        sleeping = asyncio.ensure_future(_stall("DEBUG SLEEP", server.url)())
        await asyncio.sleep(0.05)
        seen = [await ask(call) for _ in range(3)]  # on the connection; on a new one; right after that one
        await sleeping
        seen.append(await ask(call))  # the server awake, the back-off over
        return seen

    async def ours() -> list[tuple[float, Any]]:
        client = RedisClient(server.url, timeout=timeout)
        try:
            return await through(lambda: client.call("ECHO", "x"))
        finally:
            await client.aclose()

    (a, on_conn), (b, set_up), (c, after), (_, back) = uvloop.run(ours())
    record("ours", [round(a, 3), round(b, 3), round(c, 3)])
    assert isinstance(on_conn, RedisUnavailable) and "no answer from Redis within 0.3 s" in str(on_conn)
    assert timeout - 0.01 < a < timeout + 0.2
    assert isinstance(set_up, RedisUnavailable) and timeout - 0.01 < b < timeout + 0.2, (b, set_up)
    assert "cannot connect to Redis" in str(set_up) and "set-up" in str(set_up), set_up
    assert isinstance(after, RedisUnavailable) and "trying again" in str(after), after  # backed off ...
    assert c < 0.05, c  # ... so it failed at once, not after another timeout
    assert back == b"x"

    # redis-py does worse here: every call waits its socket_timeout (each of the three 0.3 s), on a connection of
    # its own; nothing backs off. (Ours did so too before this case: a set-up timed out only dropped the connection.)
    async def theirs() -> list[tuple[float, Any]]:
        client = _redis_py(server.url, timeout)
        try:
            return await through(lambda: client.echo("x"))
        finally:
            await client.aclose()

    seen = asyncio.run(theirs())
    record("redis_py", [(round(t, 3), type(r).__name__) for t, r in seen])


# -- 4. an ACL user with only what the limiter needs -----------------------------------------------------------------

# What the limiter sends (gateway.governance.limits.RedisCounters): EVALSHA, EVAL when the server answers NOSCRIPT
# (not SCRIPT LOAD: the text goes with the EVAL), MGET (read); and what its scripts run, which ACLs check too: GET,
# INCRBYFLOAT, EXPIRE (admit, add), DEL (add: a slot given back), SET (raise_to). Not INFO: a NOPERM to the client's
# INFO cluster is taken as it is (test_redis_cluster_tls.py); SELECT only for a URL naming a db other than 0. The
# keys: the limiter's prefix.
_LIMITER_COMMANDS = ("evalsha", "eval", "mget", "get", "incrbyfloat", "expire", "del", "set")


async def _set_user(admin: RedisClient, name: str, commands: tuple[str, ...], prefix: str) -> None:
    rules = ["reset", "on", ">pw", f"~{prefix}*", "-@all", *(f"+{c}" for c in commands)]
    assert await admin.call("ACL", "SETUSER", name, *rules) == b"OK"


async def _limiter_round(counters: RedisCounters) -> None:
    """Every kind of call the limiter makes: admit (GET, INCRBYFLOAT, EXPIRE), a refusal, add with a slot given
    back (DEL) and tokens counted, read (MGET), raise_to (SET)."""
    assert await counters.admit([("rpm", 2.0)], [("rpm", 1.0, 60), ("inflight", 1.0, 3600)]) == (-1, [0.0])
    assert await counters.admit([("rpm", 2.0)], [("rpm", 1.0, 60), ("inflight", 1.0, 3600)]) == (-1, [1.0])
    assert await counters.admit([("rpm", 2.0)], [("rpm", 1.0, 60)]) == (0, [2.0])  # refused
    await counters.add([("inflight", -2.0, 3600), ("tokens", 50.0, 60)])
    assert await counters.read(["inflight", "tokens", "rpm"]) == [0.0, 50.0, 2.0]
    await counters.raise_to([("budget", 7.5, 86400)])
    assert await counters.read(["budget"]) == [7.5]


def test_an_acl_user_with_only_the_limiters_commands_runs_it_and_each_of_them_is_needed(server: RedisServer) -> None:
    async def go() -> None:
        admin = RedisClient(server.url)
        try:
            for n, missing in enumerate((None, *_LIMITER_COMMANDS)):
                prefix = f"acl{n}:"
                commands = tuple(c for c in _LIMITER_COMMANDS if c != missing)
                await _set_user(admin, "limiter", commands, prefix)
                assert await admin.call("SCRIPT", "FLUSH") == b"OK"  # so that EVAL is needed (NOSCRIPT)
                url = f"redis://limiter:pw@127.0.0.1:{server.port}/0"
                counters = RedisCounters(url, prefix=prefix)
                if missing is None:
                    await _limiter_round(counters)
                    assert await admin.call("SCRIPT", "FLUSH") == b"OK"  # flushed while it runs: EVAL again
                    again = RedisCounters(url, prefix=prefix + "again:")
                    again._redis = counters._redis  # (the same connection)
                    await _limiter_round(again)
                else:
                    with pytest.raises((CountersError, ReplyError), match=r"NOPERM|can.t run this command"):
                        await _limiter_round(counters)
                await counters.aclose()
        finally:
            await admin.call("ACL", "DELUSER", "limiter")
            await admin.aclose()

    uvloop.run(go())


def test_a_wrong_password_fails_at_once_saying_so_and_a_command_not_allowed_is_a_reply_error(
    server: RedisServer, record: Callable[[str, object], None]
) -> None:
    async def ours() -> None:
        admin = RedisClient(server.url)
        await _set_user(admin, "limiter", _LIMITER_COMMANDS, "acl:")
        try:
            wrong = RedisClient(f"redis://limiter:nope@127.0.0.1:{server.port}/0")
            began = time.monotonic()
            results = await asyncio.gather(*(wrong.call("ECHO", f"{i}") for i in range(5)), return_exceptions=True)
            assert time.monotonic() - began < 0.5  # the server's refusal, not a timeout
            for result in results:
                assert isinstance(result, RedisUnavailable), result
                assert "Redis refused the connection's set-up: WRONGPASS" in str(result)
            with pytest.raises(RedisUnavailable, match=r"WRONGPASS.*trying again"):  # backed off: no connect at once
                await wrong.call("PING")
            await wrong.aclose()
            with pytest.raises(CountersError, match="WRONGPASS"):  # the limiter: on_store_error's
                await RedisCounters(f"redis://limiter:nope@127.0.0.1:{server.port}/0").admit([], [("k", 1.0, 60)])

            client = RedisClient(f"redis://limiter:pw@127.0.0.1:{server.port}/0")
            script = Script(_ADMIT)
            assert await admin.call("SCRIPT", "FLUSH") == b"OK"
            assert await client.call("MGET", "acl:a") == [None]
            conn = client._conn
            mixed = await asyncio.gather(
                client.call("INCR", "acl:a"),  # a command not allowed
                client.evalsha(script, ["acl:a", "acl:a"], [1, 5, 1, 60]),
                client.call("GET", "elsewhere:a"),  # a key not allowed
                client.evalsha(script, ["elsewhere:a", "elsewhere:a"], [1, 5, 1, 60]),  # a script's key too
                client.call("MGET", "acl:a"),
                return_exceptions=True,
            )
            assert isinstance(mixed[0], ReplyError) and str(mixed[0]).startswith("NOPERM"), mixed[0]
            assert mixed[1] == [-1, [b"0"]]
            assert isinstance(mixed[2], ReplyError) and str(mixed[2]).startswith("NOPERM"), mixed[2]
            assert isinstance(mixed[3], ReplyError) and str(mixed[3]).startswith("NOPERM"), mixed[3]
            # asked after the EVALSHA, but run before it: the server did not know the script (flushed above), and
            # its EVAL went out when the NOSCRIPT came back, after the MGET (as redis-py's SCRIPT LOAD + EVALSHA do)
            assert mixed[4] == [None]
            assert await client.call("MGET", "acl:a") == [b"1"]
            assert client._conn is conn  # one connection throughout: an error reply does not end it
            await client.aclose()
        finally:
            await admin.call("ACL", "DELUSER", "limiter")
            await admin.aclose()

    uvloop.run(ours())

    async def theirs() -> dict[str, Any]:
        admin = _redis_py(server.url, 1.0)
        await admin.acl_setuser(
            "limiter",
            enabled=True,
            reset=True,
            passwords=["+pw"],
            keys=["acl:*"],
            commands=["-@all", *(f"+{c}" for c in _LIMITER_COMMANDS)],
        )
        seen: dict[str, Any] = {}
        try:
            wrong = _redis_py(f"redis://limiter:nope@127.0.0.1:{server.port}/0", 1.0)
            began = time.monotonic()
            try:
                await wrong.echo("x")
            except Exception as exc:
                seen["wrong_password"] = f"{type(exc).__name__}: {exc}"
            seen["wrong_password_s"] = round(time.monotonic() - began, 3)
            await wrong.aclose()
            client = _redis_py(f"redis://limiter:pw@127.0.0.1:{server.port}/0", 1.0)
            results = await asyncio.gather(
                client.incr("acl:b"), client.get("elsewhere:b"), client.mget(["acl:b"]), return_exceptions=True
            )
            seen["not_allowed"] = [type(r).__name__ if isinstance(r, BaseException) else r for r in results]
            # its Script loads itself with SCRIPT LOAD after a NOSCRIPT: a user without +script cannot run it
            await admin.script_flush()
            try:
                await client.register_script(_ADMIT)(keys=["acl:b", "acl:b"], args=[1, 5, 1, 60])
                seen["script_without_script_load"] = "ran"
            except Exception as exc:
                seen["script_without_script_load"] = type(exc).__name__
            await client.aclose()
        finally:
            await admin.acl_deluser("limiter")
            await admin.aclose()
        return seen

    seen = asyncio.run(theirs())
    record("redis_py", seen)


# -- 5. many large replies at once -----------------------------------------------------------------------------------


def _value(i: int) -> bytes:
    """~10 KB, told apart by its first and last bytes and its length."""
    return b"%d:" % i + bytes([97 + i % 26]) * (10_000 + i % 97) + b":%d" % i


def test_a_thousand_calls_at_once_with_10_kb_values_each_get_their_own_reply(
    server: RedisServer, monkeypatch: pytest.MonkeyPatch, record: Callable[[str, object], None]
) -> None:
    reads: list[int] = []
    real = redis_client._Connection.data_received

    def counted(self: Any, data: bytes) -> None:
        reads.append(len(data))
        real(self, data)

    monkeypatch.setattr(redis_client._Connection, "data_received", counted)
    n = 1000

    async def ours() -> float:
        client = RedisClient(server.url, timeout=5.0)  # (the case is the replies, not the time: ~10 MB each way)
        began = time.monotonic()
        # asked before the connection is made (queued behind its set-up), then on it
        assert await asyncio.gather(*(client.call("ECHO", _value(i)) for i in range(n))) == [
            _value(i) for i in range(n)
        ]
        assert await asyncio.gather(*(client.call("SET", f"big:{i}", _value(i)) for i in range(n))) == [b"OK"] * n
        echo_and_get = [client.call("ECHO", _value(i)) if i % 2 else client.call("GET", f"big:{i}") for i in range(n)]
        assert await asyncio.gather(*echo_and_get) == [_value(i) for i in range(n)]
        assert await client.call("MGET", *(f"big:{i}" for i in range(n))) == [_value(i) for i in range(n)]  # one
        took = time.monotonic() - began
        await client.aclose()
        return took

    took = uvloop.run(ours())
    record("ours", {"s": round(took, 3), "reads": len(reads)})
    assert len(reads) > 100 and max(reads) < 10 * 1024 * 1024  # the replies came in pieces, cut anywhere
    assert sum(reads) > 3 * n * 10_000  # (ECHO, ECHO and GET, MGET)

    # redis-py, at most 50 connections of its pool (one per call else: 1000 connections)
    async def theirs() -> float:
        pool = redis.asyncio.BlockingConnectionPool.from_url(server.url, max_connections=50, timeout=5.0)
        client = redis.asyncio.Redis(connection_pool=pool)
        began = time.monotonic()
        assert await asyncio.gather(*(client.echo(_value(i)) for i in range(n))) == [_value(i) for i in range(n)]
        echo_and_get = [client.echo(_value(i)) if i % 2 else client.get(f"big:{i}") for i in range(n)]
        assert await asyncio.gather(*echo_and_get) == [_value(i) for i in range(n)]
        took = time.monotonic() - began
        await client.aclose()
        return took

    record("redis_py", {"s": round(asyncio.run(theirs()), 3)})
