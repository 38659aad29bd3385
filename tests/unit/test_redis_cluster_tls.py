"""The gateway's Redis client (``gateway.governance.redis_client``) and what it connects to (issue 37, item 12): a
Redis Cluster node is refused at connect, and ``serve`` does not start on one; a plain Redis (and one that will not
answer ``INFO``) is taken, with one ``INFO`` per connection, not per call. ``rediss://`` with redis-py's TLS options
(``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``) against a real TLS ``redis-server`` that
asks for a client certificate, with a private CA made here; and the URL's options checked when the config is read.

Every server is a real ``redis-server`` (Debian's is built with TLS) started on 127.0.0.1 on a free port."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import shutil
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.cli import main, redis_refusal
from gateway.governance.limits import CountersError, RedisCounters
from gateway.governance.redis_client import (
    Endpoint,
    RedisClient,
    RedisClusterRefused,
    RedisUnavailable,
    ReplyError,
    parse_url,
)
from gateway.settings import ConfigError, parse_settings
from tests.net import free_port
from tests.redis_server import RedisServer, start_redis


def run(coro: Any) -> Any:
    return uvloop.run(coro)  # the gateway's loop


def _need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("MESSAGES_GATEWAY_REQUIRE_REDIS"):
            pytest.fail("redis-server is required here (MESSAGES_GATEWAY_REQUIRE_REDIS) but not installed")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One cluster-enabled ``redis-server``: a cluster of one node, no slots assigned (enough: it answers
    ``INFO cluster`` with ``cluster_enabled:1``, as every node of a real cluster does)."""
    _need_redis_server()
    nodes = tmp_path_factory.mktemp("cluster") / "nodes.conf"
    # the bus port named: by default it is the port + 10000, past 65535 for most free ports
    server = start_redis(
        "--cluster-enabled", "yes", "--cluster-config-file", str(nodes), "--cluster-port", str(free_port())
    )
    try:
        yield server
    finally:
        server.stop()


# -- Redis Cluster ------------------------------------------------------------------------------------------------


def test_a_cluster_node_is_refused_at_connect_saying_why(cluster_node: RedisServer) -> None:
    async def go() -> None:
        for url in (cluster_node.url, f"redis://127.0.0.1:{cluster_node.port}/3"):  # (not SELECT's own error)
            client = RedisClient(url)
            results = await asyncio.gather(client.call("PING"), client.call("GET", "k"), return_exceptions=True)
            for result in results:
                assert isinstance(result, RedisClusterRefused), result
                assert isinstance(result, RedisUnavailable)  # what the limiter catches: on_store_error's
                said = str(result)
                assert "Redis Cluster is not supported" in said and "cluster_enabled:1" in said
                assert f"127.0.0.1:{cluster_node.port}" in said and "single server" in said
            with pytest.raises(RedisClusterRefused, match="Redis Cluster is not supported"):
                await client.call("PING")  # while it waits before connecting again: the same refusal, at once
            await client.aclose()

    run(go())


def test_the_limiter_over_a_cluster_node_fails_with_the_refusal_not_crossslot(cluster_node: RedisServer) -> None:
    async def go() -> None:
        counters = RedisCounters(cluster_node.url)
        with pytest.raises(CountersError, match="Redis Cluster is not supported"):
            await counters.admit([("a", 10.0), ("b", 10.0)], [("a", 1.0, 60), ("b", 1.0, 60)])
        await counters.aclose()

    run(go())


def _config(tmp_path: Path, redis_url: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        "auth: {open: true}\nproviders: {m: {kind: mock}}\nmodels: {a: {targets: [{provider: m}]}}\n"
        f"store: {{url: 'memory://'}}\nlimits: {{redis_url: '{redis_url}', requests_per_minute: 5}}\n"
    )
    return path


def test_serve_refuses_to_start_on_a_cluster_node_and_check_config_connect_says_so(
    cluster_node: RedisServer, tmp_path: Path, capsys: Any
) -> None:
    path = _config(tmp_path, cluster_node.url)
    assert main(["serve", "--config", str(path)]) == 2  # refused before anything listens
    err = capsys.readouterr().err
    assert err.startswith("messages-gateway: Redis at 127.0.0.1:") and "Redis Cluster is not supported" in err
    assert main(["check-config", str(path)]) == 0  # reaches nothing without --connect
    capsys.readouterr()
    assert main(["check-config", "--connect", str(path)]) == 1
    err = capsys.readouterr().err
    assert "RedisClusterRefused" in err and "Redis Cluster is not supported" in err


def test_the_start_up_check_passes_a_plain_redis_and_one_that_cannot_be_reached(
    redis_server: Any, tmp_path: Path
) -> None:
    assert redis_refusal(parse_settings(_config(tmp_path, redis_server.url).read_text())) is None
    down = f"redis://127.0.0.1:{free_port()}/0"  # on_store_error's, as at run time: not a reason not to start
    assert redis_refusal(parse_settings(_config(tmp_path, down).read_text())) is None


async def _info_calls(client: RedisClient) -> int:
    stats = (await client.call("INFO", "commandstats")).decode()
    line = next((x for x in stats.splitlines() if x.startswith("cmdstat_info:")), "calls=0,")
    return int(line.split("calls=")[1].split(",")[0])


def test_a_plain_redis_is_taken_with_one_info_per_connection_not_per_call(redis_server: Any) -> None:
    async def go() -> None:
        watcher = RedisClient(redis_server.url)
        before = await _info_calls(watcher)
        client = RedisClient(redis_server.url)
        assert await asyncio.gather(*(client.call("PING") for _ in range(50))) == [b"PONG"] * 50
        for _ in range(20):
            assert await client.call("ECHO", "x") == b"x"
        # the one INFO cluster of client's connection, and watcher's INFO commandstats that read `before`
        assert await _info_calls(watcher) - before == 2
        await client.aclose()
        await watcher.aclose()

    run(go())


def test_a_user_not_allowed_info_is_taken_as_it_is(redis_server: Any) -> None:
    """An ACL user with only what the limiter needs may not run INFO: its NOPERM does not fail the connection."""

    async def go() -> None:
        admin = RedisClient(redis_server.url)
        await admin.call("ACL", "SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-info")
        try:
            client = RedisClient(f"redis://limiter:pw@127.0.0.1:{redis_server.port}/0")
            assert await client.call("INCR", "acl-counter") >= 1
            with pytest.raises(ReplyError, match="NOPERM"):
                await client.call("INFO")
            await client.aclose()
        finally:
            await admin.call("ACL", "DELUSER", "limiter")
            await admin.aclose()

    run(go())


# -- TLS: a private CA, the server's certificate and a client's ----------------------------------------------------


@dataclass
class _Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_both: Path  # the client's certificate and key in one PEM


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _issue(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name | None = None,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    *,
    server: bool = False,
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if issuer is None:  # the CA
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        assert issuer_key is not None
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
    return builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> _Pki:
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("gateway tests CA", ca_key)
    pem = serialization.Encoding.PEM
    files = _Pki(
        root / "ca.pem",
        root / "server.pem",
        root / "server.key",
        root / "client.pem",
        root / "client.key",
        root / "both.pem",
    )
    files.ca.write_bytes(ca.public_bytes(pem))
    for who, cert_path, key_path in (
        ("server", files.server_cert, files.server_key),
        ("client", files.client_cert, files.client_key),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(f"gateway tests {who}", key, ca.subject, ca_key, server=who == "server")
        cert_path.write_bytes(cert.public_bytes(pem))
        key_path.write_bytes(_key_pem(key))
    files.client_both.write_bytes(files.client_cert.read_bytes() + files.client_key.read_bytes())
    return files


@dataclass
class _TlsRedis:
    server: RedisServer
    tls_port: int

    def url(self, query: str = "", host: str = "127.0.0.1") -> str:
        return f"rediss://{host}:{self.tls_port}/0" + (f"?{query}" if query else "")


@pytest.fixture(scope="module")
def tls_redis(pki: _Pki) -> Iterator[_TlsRedis]:
    """A ``redis-server`` with a TLS port that wants a client certificate of the CA (``--tls-auth-clients yes``);
    its plain port is there only for start_redis to see it up."""
    _need_redis_server()
    tls_port = free_port()
    server = start_redis(
        "--tls-port",
        str(tls_port),
        "--tls-cert-file",
        str(pki.server_cert),
        "--tls-key-file",
        str(pki.server_key),
        "--tls-ca-cert-file",
        str(pki.ca),
        "--tls-auth-clients",
        "yes",
    )
    try:
        yield _TlsRedis(server, tls_port)
    finally:
        server.stop()


def _q(**options: Path | str) -> str:
    return "&".join(f"{name}={value}" for name, value in options.items())


def test_tls_with_the_private_ca_and_a_client_certificate_works(tls_redis: _TlsRedis, pki: _Pki) -> None:
    urls = [
        tls_redis.url(_q(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key)),
        tls_redis.url(_q(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_both)),  # the key in the certificate's file
        tls_redis.url(_q(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_both, ssl_cert_reqs="required"), "localhost"),
        tls_redis.url(_q(ssl_certfile=pki.client_both, ssl_cert_reqs="none")),  # no verification: no CA needed
    ]

    async def go() -> None:
        for url in urls:
            client = RedisClient(url)
            assert await client.call("PING") == b"PONG", url
            assert await client.call("INCR", "tls-counter") >= 1
            assert client._conn is not None and client._conn.transport is not None
            assert client._conn.transport.get_extra_info("ssl_object") is not None  # TLS for real
            await client.aclose()

    run(go())
    default = ssl.create_default_context()  # the process's trust store is as it was: the test CA is not in it
    assert "gateway tests CA" not in str(default.get_ca_certs())


def test_tls_without_the_ca_fails_to_verify_the_server(tls_redis: _TlsRedis, pki: _Pki) -> None:
    async def go() -> None:
        for query in (_q(ssl_certfile=pki.client_both), _q(ssl_certfile=pki.client_both, ssl_cert_reqs="optional")):
            client = RedisClient(tls_redis.url(query))
            with pytest.raises(RedisUnavailable, match="certificate verify failed"):
                await client.call("PING")
            await client.aclose()

    run(go())


def test_tls_without_a_client_certificate_is_refused_by_the_server(tls_redis: _TlsRedis, pki: _Pki) -> None:
    async def go() -> None:
        client = RedisClient(tls_redis.url(_q(ssl_ca_certs=pki.ca)))
        results = await asyncio.gather(client.call("PING"), client.call("INCR", "x"), return_exceptions=True)
        assert all(isinstance(r, RedisUnavailable) for r in results), results
        for result in results:
            said = str(result)
            assert f"cannot connect to Redis at 127.0.0.1:{tls_redis.tls_port}" in said and "certificate" in said
        with pytest.raises(RedisUnavailable, match="trying again"):  # a failed connect: not tried again at once
            await client.call("PING")
        await client.aclose()

    run(go())


def test_a_name_the_server_certificate_does_not_carry_fails_unless_verification_is_off(
    tls_redis: _TlsRedis, pki: _Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host is checked against the server's certificate (which names 127.0.0.1 and localhost): ``redis.other``,
    resolved to 127.0.0.1 here, is not it."""
    import socket

    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "redis.other" else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)

    async def go() -> None:
        client = RedisClient(tls_redis.url(_q(ssl_ca_certs=pki.ca, ssl_certfile=pki.client_both), "redis.other"))
        with pytest.raises(RedisUnavailable, match=r"certificate verify failed|match"):
            await client.call("PING")
        await client.aclose()
        client = RedisClient(tls_redis.url(_q(ssl_certfile=pki.client_both, ssl_cert_reqs="none"), "redis.other"))
        assert await client.call("PING") == b"PONG"
        await client.aclose()

    asyncio.run(go())  # asyncio's loop resolves through socket.getaddrinfo (uvloop has its own resolver)


# -- the URL's TLS options, checked when the config is read ------------------------------------------------------


def test_the_tls_options_are_read_from_a_rediss_url_as_redis_py_reads_them(pki: _Pki) -> None:
    from redis.connection import SSLConnection
    from redis.connection import parse_url as redis_py_parse_url

    url = (
        f"rediss://:pw@cache.example:6390/2?ssl_ca_certs={pki.ca}&ssl_certfile={pki.client_cert}"
        f"&ssl_keyfile={pki.client_key}&ssl_cert_reqs=optional"
    )
    assert parse_url(url) == Endpoint(
        host="cache.example",
        port=6390,
        tls=True,
        password="pw",
        db=2,
        ssl_ca_certs=str(pki.ca),
        ssl_certfile=str(pki.client_cert),
        ssl_keyfile=str(pki.client_key),
        ssl_cert_reqs="optional",
    )
    theirs = redis_py_parse_url(url)  # type: ignore[no-untyped-call]
    assert theirs["connection_class"] is SSLConnection
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs"):
        assert theirs[name] == getattr(parse_url(url), name)
    assert parse_url("rediss://cache.example").ssl_cert_reqs == "required"  # redis-py's default
    assert parse_url("rediss://cache.example?ssl_cert_reqs=none").ssl_cert_reqs == "none"
    settings = parse_settings(f'auth: {{open: true}}\nlimits: {{redis_url: "{url}", requests_per_minute: 5}}')
    assert settings.limits is not None and settings.limits.redis_url == url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://redis:6379/0?ssl_ca_certs={ca}", "ssl_ca_certs only go with rediss://"),
        ("redis://redis:6379/0?ssl_cert_reqs=none", "ssl_cert_reqs only go with rediss://"),
        ("unix:///run/redis.sock?ssl_certfile={ca}&ssl_keyfile={ca}", "ssl_certfile, ssl_keyfile only go with rediss"),
        ("rediss://redis?ssl_ca_certs={missing}", "ssl_ca_certs '{missing}' cannot be read .No such file"),
        ("rediss://redis?ssl_certfile={missing}", "ssl_certfile '{missing}' cannot be read"),
        ("rediss://redis?ssl_certfile={ca}&ssl_keyfile={missing}", "ssl_keyfile '{missing}' cannot be read"),
        ("rediss://redis?ssl_ca_certs={directory}", "ssl_ca_certs '{directory}' cannot be read"),
        ("rediss://redis?ssl_keyfile={ca}", "set ssl_certfile too"),
        ("rediss://redis?ssl_cert_reqs=CERT_REQUIRED", "ssl_cert_reqs must be one of required, optional, none"),
        ("rediss://redis?ssl_check_hostname=false", "unsupported parameter.*ssl_check_hostname"),
    ],
)
def test_a_tls_option_it_cannot_use_is_refused_when_the_config_is_read(
    url: str, says: str, pki: _Pki, tmp_path: Path
) -> None:
    names = {"ca": pki.ca, "missing": tmp_path / "nowhere" / "ca.pem", "directory": tmp_path}
    url, says = url.format(**names), says.format(**names)
    with pytest.raises(ValueError, match=says):
        parse_url(url)
    with pytest.raises(ConfigError, match=says):
        parse_settings(f'limits: {{redis_url: "{url}", requests_per_minute: 5}}')
