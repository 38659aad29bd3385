"""The gateway's own Redis client (``gateway.governance.redis_client``) against a real ``redis-server``: pipelined
replies in order, scripts by SHA-1 with the text sent when the server has forgotten them, AUTH and SELECT from the
URL, a Unix socket; and against servers written here that accept and never answer, or hang up mid-call."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import uvloop

from gateway.governance.redis_client import Endpoint, RedisClient, RedisUnavailable, ReplyError, Script, parse_url
from gateway.settings import ConfigError, parse_settings
from tests.redis_server import start_redis


def run(coro: Any) -> Any:
    return uvloop.run(coro)  # the gateway's loop (uvloop's transports are not asyncio.Transport subclasses)


@pytest.mark.parametrize(
    ("url", "endpoint"),
    [
        ("redis://127.0.0.1:6380/2", Endpoint(port=6380, db=2)),
        ("redis://redis", Endpoint(host="redis")),
        ("redis://:s%40cret@redis:6379/0", Endpoint(host="redis", password="s@cret")),
        ("redis://gw:pw@redis/3", Endpoint(host="redis", username="gw", password="pw", db=3)),
        ("rediss://cache.example:6390", Endpoint(host="cache.example", port=6390, tls=True)),
        ("redis://redis:6379?db=4", Endpoint(host="redis", db=4)),
        ("unix:///run/redis.sock?db=1", Endpoint(path="/run/redis.sock", db=1)),
        ("redis://[::1]:6379/0", Endpoint(host="::1")),
    ],
)
def test_urls_are_read_as_redis_py_reads_them(url: str, endpoint: Endpoint) -> None:
    from redis.connection import SSLConnection, UnixDomainSocketConnection
    from redis.connection import parse_url as redis_py_parse_url

    assert parse_url(url) == endpoint
    theirs = redis_py_parse_url(url)  # type: ignore[no-untyped-call]  # the URL an operator wrote for redis-py means the same here
    kind = theirs.get("connection_class")
    assert (endpoint.tls, endpoint.path is not None) == (kind is SSLConnection, kind is UnixDomainSocketConnection)
    if endpoint.path is None:
        assert (endpoint.host, endpoint.port) == (theirs["host"], theirs.get("port", 6379))
    else:
        assert endpoint.path == theirs["path"]
    assert (endpoint.username, endpoint.password, endpoint.db) == (
        theirs.get("username"),
        theirs.get("password"),
        theirs.get("db", 0),
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://redis:6379", "must start with redis://"),
        ("redis://redis:6379/x", "must be numbers"),
        ("redis://redis:port", "must be numbers"),
        ("redis://redis/0?socket_timeout=1", "unsupported parameter"),
        ("unix://", "needs a socket path"),
        ("redis:///0", "no host"),
        ("redis://gw@redis:6379/0", "has no password"),  # would have authenticated as `default` (issue 37, 11)
        ("unix://gw@/run/redis.sock", "has no password"),
    ],
)
def test_a_url_it_cannot_use_is_refused_when_the_config_is_read(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_url(url)
    with pytest.raises(ConfigError, match=says):
        parse_settings(f'limits: {{redis_url: "{url}", requests_per_minute: 5}}')


def test_many_calls_under_way_at_once_each_get_their_own_reply(redis_server: Any) -> None:
    async def go() -> None:
        client = RedisClient(redis_server.url)
        echo = Script("return {KEYS[1], ARGV[1]}")
        replies = await asyncio.gather(
            *(client.evalsha(echo, [f"k{i}"], [i]) if i % 2 else client.call("ECHO", f"v{i}") for i in range(500))
        )
        assert replies == [[f"k{i}".encode(), str(i).encode()] if i % 2 else f"v{i}".encode() for i in range(500)]
        with pytest.raises(ReplyError, match="unknown command"):
            await client.call("NO-SUCH-COMMAND")
        assert await client.call("PING") == b"PONG"  # an error reply leaves the connection as it was
        await client.aclose()
        with pytest.raises(RedisUnavailable, match="closed"):
            await client.call("PING")

    run(go())


def test_a_script_the_server_forgot_is_sent_whole_and_the_reply_is_the_same(redis_server: Any) -> None:
    async def go() -> None:
        client = RedisClient(redis_server.url)
        script = Script("return tonumber(ARGV[1]) * 2")
        assert await client.call("SCRIPT", "FLUSH") == b"OK"
        assert await client.call("SCRIPT", "EXISTS", script.sha) == [0]
        assert await asyncio.gather(*(client.evalsha(script, [], [i]) for i in range(5))) == [0, 2, 4, 6, 8]
        assert await client.call("SCRIPT", "EXISTS", script.sha) == [1]
        evals = await _calls(client, "eval")
        evalshas = await _calls(client, "evalsha")
        assert await client.evalsha(script, [], [21]) == 42
        assert await _calls(client, "eval") == evals  # known now: its SHA-1 alone
        assert await _calls(client, "evalsha") == evalshas + 1
        await client.aclose()

    run(go())


async def _calls(client: RedisClient, command: str) -> int:
    stats = (await client.call("INFO", "commandstats")).decode()
    line = next(x for x in stats.splitlines() if x.startswith(f"cmdstat_{command}:"))
    return int(line.split("calls=")[1].split(",")[0])


def test_auth_and_select_from_the_url_and_a_wrong_password_fails_every_call() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = start_redis("--requirepass", "s3cret")
    try:

        async def go() -> None:
            good = RedisClient(f"redis://:s3cret@127.0.0.1:{server.port}/5")
            assert await good.call("SET", "here", "yes") == b"OK"
            other = RedisClient(f"redis://default:s3cret@127.0.0.1:{server.port}/0")
            assert await other.call("GET", "here") is None  # database 0, not 5
            assert await other.call("SELECT", 5) == b"OK"
            assert await other.call("GET", "here") == b"yes"
            bad = RedisClient(f"redis://:wrong@127.0.0.1:{server.port}/0")
            results = await asyncio.gather(bad.call("PING"), bad.call("PING"), return_exceptions=True)
            assert all(isinstance(r, RedisUnavailable) and "set-up" in str(r) for r in results), results
            none = RedisClient(f"redis://127.0.0.1:{server.port}/0")
            with pytest.raises(ReplyError, match="NOAUTH"):
                await none.call("PING")
            for client in (good, other, bad, none):
                await client.aclose()

        run(go())
    finally:
        server.stop()


def test_a_unix_socket() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    sock = Path(tempfile.mkdtemp(prefix="gateway-redis-sock-")) / "redis.sock"
    server = start_redis("--unixsocket", str(sock))
    try:

        async def go() -> None:
            client = RedisClient(f"unix://{sock}?db=2")
            assert await client.call("SET", "k", "v") == b"OK"
            assert await client.call("CLIENT", "INFO") != b""
            await client.aclose()

        run(go())
    finally:
        server.stop()


class _Silent(asyncio.Protocol):
    """Accepts, reads, never answers; or answers the first command and then hangs up."""

    hang_up = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.hang_up:
            self.transport.close()


def test_a_silent_server_fails_every_call_under_way_within_the_timeout_backs_off_then_connects_again() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        connections: list[_Silent] = []

        def made() -> _Silent:
            connections.append(_Silent())
            return connections[-1]

        server = await loop.create_server(made, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = RedisClient(f"redis://127.0.0.1:{port}/0", timeout=0.3)
        started = time.monotonic()
        first = client.call("PING")
        await asyncio.sleep(0.1)
        second = client.call("PING")  # asked later, failed with the first: the connection is given up
        results = await asyncio.gather(first, second, return_exceptions=True)
        waited = time.monotonic() - started
        assert all(isinstance(r, RedisUnavailable) and "within 0.3 s" in str(r) for r in results), results
        assert 0.27 <= waited < 0.3 + 0.5
        assert len(connections) == 1
        quick = time.monotonic()
        with pytest.raises(RedisUnavailable, match=r"no answer to the set-up within 0\.3 s \(trying again in"):
            await client.call("PING")  # backed off after a set-up that went unanswered: fails at once, no connect
        assert time.monotonic() - quick < 0.05 and len(connections) == 1
        await asyncio.sleep(0.1)  # the first back-off: 50 ms, jittered
        _Silent.hang_up = True
        try:
            with pytest.raises(RedisUnavailable, match="closed the connection"):
                await client.call("PING")  # a fresh connection, which the server closes mid-call
        finally:
            _Silent.hang_up = False
        assert len(connections) == 2
        assert client._conn is None  # given up on, and with it its timer and the calls that were under way
        await client.aclose()
        server.close()
        await server.wait_closed()

    run(go())


def test_nothing_listening_fails_at_once() -> None:
    from tests.net import free_port

    async def go() -> None:
        client = RedisClient(f"redis://127.0.0.1:{free_port()}/0", timeout=5)
        started = time.monotonic()
        with pytest.raises(RedisUnavailable, match="cannot connect"):
            await client.call("PING")
        assert time.monotonic() - started < 1
        assert client._conn is None  # given up on, and with it its timer and the calls that were under way
        await client.aclose()

    run(go())


def test_a_client_used_from_a_second_event_loop_connects_again_there(redis_server: Any) -> None:
    client = RedisClient(redis_server.url)

    async def ping() -> Any:
        return await client.call("PING")

    assert run(ping()) == b"PONG"
    assert run(ping()) == b"PONG"  # the first loop (and its connection) is gone
    assert asyncio.run(ping()) == b"PONG"


def test_commands_asked_in_one_loop_turn_go_out_in_one_write(redis_server: Any) -> None:
    """ioredis's auto-pipelining: what several requests ask in the same turn shares one system call."""

    async def go() -> None:
        client = RedisClient(redis_server.url)
        assert await client.call("PING") == b"PONG"
        assert client._conn is not None and client._conn.transport is not None
        transport = client._conn.transport  # asyncio's own transport (this test runs on asyncio's loop)
        writes: list[bytes] = []
        write = transport.write

        def recorded(data: Any) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = recorded  # type: ignore[method-assign]
        replies = await asyncio.gather(*(client.call("ECHO", str(i)) for i in range(20)))
        assert replies == [str(i).encode() for i in range(20)]
        assert len(writes) == 1 and writes[0].count(b"ECHO") == 20
        client.call("SET", "a", "1")  # asked and forgotten (a settlement): still written at the turn's end
        assert await client.call("GET", "a") == b"1"
        assert len(writes) == 2
        await client.aclose()

    asyncio.run(go())
