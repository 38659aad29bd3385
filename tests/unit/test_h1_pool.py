"""The h1 client's connections (issue 37, items 4 and 7), against real sockets on 127.0.0.1 and ::1:

- Happy Eyeballs (RFC 8305): a name whose first address drops the connection attempt (an IPv6 listener whose accept
  queue is full: the kernel drops the SYN, as a black-holed route does) and whose second address answers connects in
  about the 0.25 s attempt delay, not after the whole connect timeout — as aiohttp does;
- the resolver's answers are kept for ``dns_ttl_s`` (a name is not looked up per connection), then asked again;
- the pool keeps as many idle connections per origin as were in flight (a second wave of 200 concurrent requests
  opens none), the provider's ``pool_size`` bounds it, idle connections expire after ``pool_idle_s`` (closed, not
  reused), and ``/metrics`` counts them: open, idle, created, reused."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.observability.metrics import PoolMetrics
from gateway.wire.upstream import H1Client, Timeouts
from tests.unit.test_h1_protocol_states import Upstream, answer


def _v6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port on ::1 that never completes a handshake: a listener that never accepts, its queue full."""
    listener = socket.socket(socket.AF_INET6)
    listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    listener.bind(("::1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.socket(socket.AF_INET6)
    filler.connect(("::1", port))  # the one connection the queue holds; the next SYN is dropped
    probe = socket.socket(socket.AF_INET6)
    probe.settimeout(0.3)
    with pytest.raises(TimeoutError):  # (the premise: a connect here hangs)
        probe.connect(("::1", port))
    probe.close()
    yield port
    filler.close()
    listener.close()


def addresses(v6_port: int, v4_port: int) -> list[Any]:
    return [
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", v6_port, 0, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", v4_port)),
    ]


async def respond(n: int, writer: asyncio.StreamWriter) -> None:
    writer.write(answer(n))


@pytest.mark.skipif(not _v6(), reason="no ::1 on this machine")
def test_an_unreachable_first_address_costs_the_attempt_delay_not_the_connect_timeout(black_hole: int) -> None:
    with Upstream(respond) as upstream:
        v4_port = int(upstream.url.rsplit(":", 1)[1])

        async def h1() -> float:
            async def resolve(host: str, port: int) -> list[Any]:
                return addresses(black_hole, v4_port)

            client = H1Client(resolve=resolve)
            try:
                started = time.monotonic()
                resp = await client.send(
                    "POST",
                    f"http://provider.test:{v4_port}/x",
                    headers={"x-request": "1"},
                    body=b"{}",
                    timeouts=Timeouts(connect=5.0, read=5.0),
                )
                assert await resp.read() == b"answer to 1"
                return time.monotonic() - started
            finally:
                await client.aclose()

        async def with_aiohttp() -> float:  # the library the client replaced, given the same two addresses
            class Resolver(aiohttp.abc.AbstractResolver):
                async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[Any]:
                    return [
                        {"hostname": host, "host": a[4][0], "port": a[4][1], "family": a[0], "proto": 6, "flags": 0}
                        for a in addresses(black_hole, v4_port)
                    ]

                async def close(self) -> None:
                    return None

            connector = aiohttp.TCPConnector(resolver=Resolver())
            async with aiohttp.ClientSession(connector=connector) as session:
                started = time.monotonic()
                async with session.post(
                    f"http://provider.test:{v4_port}/x",
                    data=b"{}",
                    headers={"x-request": "2"},
                    timeout=aiohttp.ClientTimeout(sock_connect=5.0),
                ) as resp:
                    assert await resp.read() == b"answer to 2"
                return time.monotonic() - started

        took, reference = asyncio.run(h1()), asyncio.run(with_aiohttp())
    assert 0.2 <= took < 1.5, took  # the 0.25 s attempt delay, then the IPv4 address: not the 5 s connect timeout
    assert reference < 1.5, reference


def test_a_name_is_resolved_once_per_ttl() -> None:
    looked_up: list[str] = []
    with Upstream(respond) as upstream:
        port = int(upstream.url.rsplit(":", 1)[1])

        async def main() -> None:
            async def resolve(host: str, port_: int) -> list[Any]:
                looked_up.append(host)
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port_))]

            client = H1Client(resolve=resolve, dns_ttl_s=0.5, pool=0)  # pool 0: a new connection per request
            t = Timeouts(connect=2.0, read=2.0)
            try:
                for n in range(3):
                    resp = await client.send(
                        "POST", f"http://provider.test:{port}/", headers={"x-request": str(n)}, body=b"{}", timeouts=t
                    )
                    await resp.read()
                assert looked_up == ["provider.test"]  # three connections, one look-up
                await asyncio.sleep(0.6)
                resp = await client.send(
                    "POST", f"http://provider.test:{port}/", headers={"x-request": "9"}, body=b"{}", timeouts=t
                )
                await resp.read()
                assert looked_up == ["provider.test"] * 2  # the answer aged out: asked again
            finally:
                await client.aclose()

        asyncio.run(main())
        assert upstream.connections == 4


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return value if value is not None else 0.0


def test_a_second_wave_as_large_as_the_first_opens_no_connection_and_metrics_count_them() -> None:
    async def slow(n: int, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)  # long enough for every request of a wave to be in flight at once
        writer.write(answer(n))

    registry = CollectorRegistry()
    with Upstream(slow) as upstream:
        origin = upstream.url + ""  # http://127.0.0.1:port
        wave = 200

        async def main() -> None:
            client = H1Client()
            client.metrics = PoolMetrics(registry)
            t = Timeouts(connect=5.0, read=5.0)

            async def one(n: int) -> None:
                resp = await client.send(
                    "POST", f"{upstream.url}/", headers={"x-request": str(n)}, body=b"{}", timeouts=t
                )
                assert await resp.read() == b"answer to %d" % n

            try:
                await asyncio.gather(*(one(n) for n in range(wave)))
                first = upstream.connections
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="idle") == first
                await asyncio.gather(*(one(n) for n in range(wave, 2 * wave)))
                assert upstream.connections == first  # (aiohttp: the same; the 64-connection pool opened 436 anew)
                assert sample(registry, "gateway_upstream_connections_created_total", origin=origin) == first
                assert sample(registry, "gateway_upstream_connections_reused_total", origin=origin) == wave
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="open") == first
            finally:
                await client.aclose()
            await asyncio.sleep(0.1)  # the closes land
            assert sample(registry, "gateway_upstream_connections", origin=origin, state="open") == 0
            assert sample(registry, "gateway_upstream_connections", origin=origin, state="idle") == 0

        asyncio.run(main())


def test_the_providers_pool_size_bounds_the_idle_connections_and_idle_ones_expire() -> None:
    async def slow(n: int, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.05)
        writer.write(answer(n))

    registry = CollectorRegistry()
    with Upstream(slow) as upstream:
        origin = upstream.url

        async def main() -> None:
            client = H1Client()
            client.metrics = PoolMetrics(registry)
            t = Timeouts(connect=5.0, read=5.0, pool=4, idle_s=0.3)

            async def one(n: int) -> None:
                resp = await client.send(
                    "POST", f"{upstream.url}/", headers={"x-request": str(n)}, body=b"{}", timeouts=t
                )
                await resp.read()

            try:
                await asyncio.gather(*(one(n) for n in range(10)))
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="idle") == 4
                await asyncio.sleep(0.1)
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="open") == 4
                await one(100)  # within the idle time: reused
                assert upstream.connections == 10
                await asyncio.sleep(0.8)  # past it: closed by the sweep, without a request to notice
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="idle") == 0
                assert sample(registry, "gateway_upstream_connections", origin=origin, state="open") == 0
                await one(101)
                assert upstream.connections == 11  # a fresh one
            finally:
                await client.aclose()

        asyncio.run(main())


@pytest.mark.long
def test_a_stream_outlives_the_idle_expiry_and_its_connection_is_reused_after() -> None:
    """On the default settings (``pool_idle_s`` 15 s): a connection busy with a 20 s stream is not idle, so the
    expiry never touches it, and once released it is reused (its expiry counted from its release)."""
    seconds = 20

    async def trickle(n: int, writer: asyncio.StreamWriter) -> None:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(seconds):
                await writer.drain()
                await asyncio.sleep(1.0)
                writer.write(b"1\r\n.\r\n")
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(answer(n))

    with Upstream(trickle) as upstream:

        async def main() -> None:
            client = H1Client()
            t = Timeouts(connect=10.0, read=600.0)  # the providers' defaults (pool_idle_s: Timeouts' own, 15 s)
            assert t.idle_s == 15.0
            try:
                started = time.monotonic()
                resp = await client.send("POST", f"{upstream.url}/", headers={"x-request": "1"}, body=b"{}", timeouts=t)
                assert await resp.read() == b"." * seconds
                assert time.monotonic() - started >= 15.0
                resp = await client.send("POST", f"{upstream.url}/", headers={"x-request": "2"}, body=b"{}", timeouts=t)
                assert await resp.read() == b"answer to 2"
            finally:
                await client.aclose()

        asyncio.run(main())
        assert upstream.connections == 1
