"""``messages-gateway``: ``serve`` the gateway, or ``check-config`` a YAML file."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

from gateway.http.server import PROTOCOL
from gateway.settings import ConfigError, Settings, default_config_path, load_settings

if TYPE_CHECKING:
    from gateway.http.app import GatewayApp

__all__ = ["app_from_env", "configure_logging", "describe", "main", "preflight", "redis_refusal", "serving_warnings"]

_CONFIG_ENV = "MESSAGES_GATEWAY_CONFIG"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    """INFO and up to stderr, one line per record (the access log is one per request), in this process.
    The format uses none of the caller, thread or process fields, so the logging module is told not to
    collect them (the logging HOWTO's "Optimization" switches): ~10 µs less per access-log line."""
    from gateway.observability.recording import write_access_lines_to

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    handlers = logging.root.handlers
    write_access_lines_to(handlers[0] if len(handlers) == 1 else None)  # type: ignore[arg-type]
    logging._srcfile = None  # no stack walk for the caller's file and line
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def app_from_env() -> GatewayApp:
    """The uvicorn factory: every worker process builds its own app from the same config file (and, being
    a fresh process when there are several workers, sets up its own logging)."""
    from gateway.http.app import create_app
    from gateway.wire.upstream import DEFAULT_CLIENT

    configure_logging()
    path = os.environ.get(_CONFIG_ENV) or default_config_path()
    return create_app(
        load_settings(path),
        upstream_client=os.environ.get("MESSAGES_GATEWAY_UPSTREAM_CLIENT", DEFAULT_CLIENT),
        config_path=path,  # reloaded on SIGHUP and when the file changes
    )


def serving_warnings(
    workers: int,
    environ: dict[str, str] | None = None,
    decoder: str | None = None,
    views: bool | None = None,
    otlp: str | None = None,
) -> list[str]:
    """What an operator should know before serving. Metrics: one process per container is this gateway's
    mode (prometheus-client's registries are per process); several workers split the counters between
    processes and a scrape sees whichever one answers. ``decoder``: which event-stream frame loop is in use
    (default: the one imported); ``views``: whether gateway.wire._views_c is in use (default: whether it imported);
    ``otlp``: which OTLP encoder is in use (gateway.observability.otlp_proto's)."""
    if decoder is None:
        from adapters._eventstream import IMPLEMENTATION as decoder
    if views is None:
        from gateway.wire.events import COMPILED_VIEWS as views
    notes = []
    if decoder != "c":
        notes.append(
            "adapters._eventstream_c was not built (no C compiler at install time): Bedrock event streams are "
            "decoded by the pure-Python frame loop, ~0.5 ms more CPU per 200-delta stream"
        )
    if not views:
        notes.append(
            "gateway.wire._views_c was not built (no C compiler at install time): every event is decoded by msgspec, "
            "~0.1 ms more CPU per 200-delta stream"
        )
    if otlp is None:
        from gateway.observability.otlp_proto import IMPLEMENTATION as otlp
    if otlp != "c":
        notes.append(
            "gateway.observability._otlp_c was not built (no C compiler at install time): traced requests' spans "
            "are encoded in Python, ~15 µs more CPU per traced request"
        )
    return notes


def multiprocess_metrics(workers: int) -> Callable[[], None]:
    """With several workers, prometheus-client's multiprocess mode: each worker writes its values to files in a
    fresh directory and a scrape of any worker merges them all, so ``/metrics`` is exact for any N. Returns what
    removes the directory when the server has stopped (nothing to do for one worker, or a directory the operator
    set with ``PROMETHEUS_MULTIPROC_DIR``)."""
    if workers <= 1 or os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return lambda: None
    directory = tempfile.mkdtemp(prefix="messages-gateway-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # before the workers start: they import prometheus_client

    def cleanup() -> None:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(directory, ignore_errors=True)

    return cleanup


def _has_limits(settings: Settings) -> bool:
    keyed = any(getattr(k, "limits", None) is not None for k in settings.auth.keys)
    teamed = any(t.limits is not None for t in settings.teams.values())
    return keyed or teamed or settings.limits is not None


def _ledger_path(settings: Settings) -> Path | None:
    url = settings.store.resolved_url()
    return Path(unquote(url[len("sqlite:///") :])) if url.startswith("sqlite:///") else None


def preflight(settings: Settings, workers: int) -> list[str]:
    """What ``serve`` refuses to start with, each with its fix (``check-config`` runs the same checks): several
    workers counting limits alone, a PostgreSQL ledger without its driver, a SQLite ledger in a directory that cannot
    be written, OTLP over gRPC without grpcio."""
    problems = []
    if workers > 1 and _has_limits(settings) and not (settings.limits and settings.limits.redis_url):
        problems.append(
            f"{workers} workers would each count the rate limits and budgets on their own: "
            "set limits.redis_url (one Redis for every worker and replica), or serve with workers: 1"
        )
    if settings.store.enabled:
        url = settings.store.resolved_url()
        if url.startswith(("postgresql://", "postgres://")) and importlib.util.find_spec("asyncpg") is None:
            problems.append(
                "store.url is a PostgreSQL ledger but its driver, asyncpg, is not installed: "
                "pip install 'messages-gateway[postgres]'"
            )
        path = _ledger_path(settings)
        if path is not None and (problem := _unwritable(path)) is not None:
            problems.append(problem)
    from gateway.observability.otlp_export import export_config

    otlp = export_config(settings)
    if otlp is not None and otlp.protocol == "grpc" and importlib.util.find_spec("grpc") is None:
        problems.append(
            "telemetry.otlp exports over gRPC but grpcio is not installed: pip install 'messages-gateway[otel]' "
            "(or protocol: http/protobuf, which needs nothing more)"
        )
    return problems


def redis_refusal(settings: Settings, wait_s: float = 2.0) -> str | None:
    """Why ``serve`` must not start on ``limits.redis_url``: it is a Redis Cluster node (which the client refuses at
    connect: ``gateway.governance.redis_client``), or None. One connect of at most ``wait_s``, apart from
    ``preflight`` (which reaches nothing). A Redis that cannot be reached now is not refused: ``on_store_error``
    is for that, and the limits hold as soon as it is back."""
    redis_url = settings.limits.redis_url if settings.limits is not None else None
    if not redis_url:
        return None
    import asyncio

    from gateway.governance.redis_client import RedisClient, RedisClusterRefused

    async def probe(url: str) -> str | None:
        client = RedisClient(url, timeout=wait_s)
        try:
            await asyncio.wait_for(client.call("PING"), wait_s)
        except RedisClusterRefused as exc:
            return str(exc)
        except Exception:  # unreachable, slow, or it refused the PING: on_store_error's, as at run time
            return None
        finally:
            await client.aclose()
        return None

    return asyncio.run(probe(redis_url))


def _unwritable(path: Path) -> str | None:
    """Why the SQLite ledger at ``path`` cannot be written (its directory made if missing, as the store would), or
    None. A real write, not a permission-bit reading (root passes every ``access`` check; a read-only mount does
    not)."""
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".messages-gateway-check-"):
            pass
        if path.exists():
            with path.open("ab"):
                pass
    except OSError as exc:
        where = path if path.exists() else directory
        return (
            f"the usage ledger {str(path)!r} cannot be written ({exc.strerror or exc}): make {str(where)!r} "
            "writable by this user, set store.url (or MESSAGES_GATEWAY_DATA_DIR) to a writable directory, "
            "or say store.enabled: false"
        )
    return None


def provider_urls(settings: Settings) -> dict[str, str]:
    """Each configured provider's base URL, as its adapter builds it (a mock has none)."""
    from adapters._aws import aws_region
    from adapters.vertex import vertex_base_url
    from gateway.settings import (
        AnthropicProvider,
        BedrockMantleProvider,
        BedrockProvider,
        ClaudeAwsProvider,
        FoundryProvider,
        VertexProvider,
    )

    urls = {}
    for name, config in settings.providers.items():
        match config:
            case AnthropicProvider():
                urls[name] = config.base_url
            case BedrockProvider():
                region = aws_region(config.region, config.profile)
                urls[name] = config.base_url or f"https://bedrock-runtime.{region}.amazonaws.com"
            case BedrockMantleProvider():
                region = aws_region(config.region, config.profile)
                urls[name] = config.base_url or f"https://bedrock-mantle.{region}.api.aws/anthropic"
            case ClaudeAwsProvider():
                region = aws_region(config.region, config.profile)
                urls[name] = config.base_url or f"https://aws-external-anthropic.{region}.api.aws"
            case VertexProvider():
                urls[name] = config.base_url or vertex_base_url(config.region)
            case FoundryProvider():
                urls[name] = config.base_url or f"https://{config.resource}.services.ai.azure.com/anthropic"
    return urls


async def connect_checks(settings: Settings, wait_s: float = 5.0) -> list[tuple[str, str | None]]:
    """``check-config --connect``: open the store (its schema made, as at start-up), ping Redis, and open a TCP
    connection to each provider's host. Each check as ``(what, None)`` when it worked, else ``(what, why)``."""
    import asyncio

    from gateway.governance.redis_client import RedisClient
    from gateway.governance.store import open_store

    results: list[tuple[str, str | None]] = []
    if settings.store.enabled:
        what = "store " + describe(settings, 1).partition("store: ")[2].partition(";")[0]
        try:
            store = open_store(settings.store.resolved_url())
            try:
                await asyncio.wait_for(store.open(), wait_s)
            finally:
                await store.aclose()
            results.append((what, None))
        except Exception as exc:
            results.append((what, f"{type(exc).__name__}: {exc}"))
    redis_url = settings.limits.redis_url if settings.limits is not None else None
    if redis_url:
        client = RedisClient(redis_url, timeout=wait_s)
        try:
            pong = await asyncio.wait_for(client.call("PING"), wait_s)
            results.append((f"Redis {_masked(redis_url)}", None if pong in ("PONG", b"PONG") else f"PING: {pong!r}"))
        except Exception as exc:
            results.append((f"Redis {_masked(redis_url)}", f"{type(exc).__name__}: {exc}"))
        finally:
            await client.aclose()
    for name, url in provider_urls(settings).items():
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        what = f"provider {name!r} {parts.hostname}:{port}"
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), wait_s)
            writer.close()
            results.append((what, None))
        except Exception as exc:
            results.append((what, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__))
    return results


def describe(settings: Settings, workers: int) -> str:
    """The start-up line naming where state lives: the ledger, the limits' backend, the workers."""
    if not settings.store.enabled:
        store = "none (store.enabled: false)"
    else:
        url = settings.store.resolved_url()
        path = _ledger_path(settings)
        if path is not None:
            store = f"SQLite {path.resolve()}"
        elif url.startswith("memory://"):
            store = "memory (lost at exit)"
        else:
            store = "PostgreSQL " + _masked(url)
    redis_url = settings.limits.redis_url if settings.limits is not None else None
    limits = f"Redis {_masked(redis_url)}" if redis_url else "memory (this process)"
    return f"store: {store}; limits: {limits}; workers: {workers}"


def _masked(url: str) -> str:
    """``url`` without its password: ``postgresql://user:***@host/db``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = netloc[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    path = args.config or default_config_path()
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        print(f"messages-gateway: {exc}", file=sys.stderr)
        return 2
    os.environ[_CONFIG_ENV] = str(path)
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    workers = args.workers or settings.server.workers
    problems = preflight(settings, workers)
    if not problems and (refusal := redis_refusal(settings)) is not None:
        problems.append(refusal)
    for problem in problems:
        print(f"messages-gateway: {problem}", file=sys.stderr)
    if problems:
        return 2
    configure_logging()
    log = logging.getLogger("gateway")
    log.info("serving %s on http://%s:%d (%d worker%s)", path, host, port, workers, "" if workers == 1 else "s")
    log.info("%s", describe(settings, workers))
    for note in serving_warnings(workers):
        log.warning("%s", note)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler it found here: a
    # stop that drained is a clean exit (status 0, what `docker stop` / Kubernetes expect), not a death by signal
    signal.signal(signal.SIGTERM, _stopped)
    os.environ["MESSAGES_GATEWAY_WORKERS"] = str(workers)  # what the workers report (the status's `worker`)
    cleanup = multiprocess_metrics(workers)
    try:
        _run(uvicorn, settings, host, port, workers)
    finally:
        cleanup()
    return 0


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    return {
        "factory": True,
        "loop": "uvloop",
        "http": PROTOCOL,  # httptools, with limits on the request head (gateway/http/server.py)
        "lifespan": "on",
        "access_log": False,
        "log_level": "warning",
        # SIGTERM: the gateway ends streams still running after drain_timeout_s with an `error` event
        # (gateway.http.app); uvicorn's own limit is a backstop a little later.
        "timeout_graceful_shutdown": math.ceil(settings.server.drain_timeout_s) + 5,
    }


def _run(uvicorn: Any, settings: Settings, host: str, port: int, workers: int) -> None:
    options = _uvicorn_options(settings)
    if workers > 1 and hasattr(socket, "SO_REUSEPORT"):
        run_workers(workers, host, port, options)
        return
    uvicorn.run("gateway.cli:app_from_env", host=host, port=port, workers=workers, **options)


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening socket of this worker's own on ``host:port``, in the port's SO_REUSEPORT group: the kernel
    spreads new connections across the group's sockets, so each worker gets its share of keep-alive
    connections (one shared socket lets whichever worker wakes first take them all: docs/benchmarks.md)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _worker(host: str, port: int, options: dict[str, Any]) -> None:
    """One worker process (spawned): its own socket, its own uvicorn server, the app built from the config."""
    import uvicorn

    sock = reuseport_socket(host, port)
    config = uvicorn.Config("gateway.cli:app_from_env", **options)
    uvicorn.Server(config).run(sockets=[sock])


def run_workers(workers: int, host: str, port: int, options: dict[str, Any]) -> None:
    """Several workers, each with its own SO_REUSEPORT socket (issue 21). SIGTERM, SIGINT and SIGHUP go to every
    worker (each drains, or reloads); a worker that dies otherwise is started again; returns when all have
    stopped after a stop signal."""
    import multiprocessing

    if port == 0:  # every worker must bind the same port: choose it here
        probe = reuseport_socket(host, 0)
        port = probe.getsockname()[1]
        probe.close()
    context = multiprocessing.get_context("spawn")
    log = logging.getLogger("gateway")
    stopping = False

    started: dict[int, float] = {}

    def start() -> Any:
        process = context.Process(target=_worker, args=(host, port, options), name="gateway-worker")
        process.start()
        started[id(process)] = time.monotonic()
        return process

    processes = [start() for _ in range(workers)]

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        if signum != signal.SIGHUP:
            stopping = True
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while any(process.is_alive() for process in processes) or not stopping:
            for i, process in enumerate(processes):
                process.join(0.2)
                if not process.is_alive() and not stopping:
                    if time.monotonic() - started[id(process)] < 5:  # it could not start: nor will the next
                        forward(signal.SIGTERM, None)
                        raise SystemExit(f"messages-gateway: a worker failed to start (exit {process.exitcode})")
                    log.warning("worker %s exited (code %s): starting another", process.pid, process.exitcode)
                    processes[i] = start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.path)
    except ConfigError as exc:
        print(f"messages-gateway: {exc}", file=sys.stderr)
        return 2
    from gateway.governance.limits import unpriced_routes

    for warning in unpriced_routes(settings):
        print(f"warning: {warning}", file=sys.stderr)
    problems = preflight(settings, settings.server.workers)
    for problem in problems:
        print(f"messages-gateway: {problem}", file=sys.stderr)
    if problems:
        return 2
    if args.connect:
        import asyncio

        failed = 0
        for what, why in asyncio.run(connect_checks(settings)):
            print(f"{what}: {'reached' if why is None else 'FAILED: ' + why}", file=sys.stderr if why else sys.stdout)
            failed += why is not None
        if failed:
            print(f"messages-gateway: {failed} of the --connect checks failed", file=sys.stderr)
            return 1
    print(f"{args.path}: OK — {len(settings.providers)} providers, {len(settings.models)} model routes")
    print(describe(settings, settings.server.workers))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="messages-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", help="YAML config (default: config/gateway.yaml)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.set_defaults(func=_serve)
    check = sub.add_parser("check-config", help="validate a YAML config and exit")
    check.add_argument("path")
    check.add_argument(
        "--connect", action="store_true", help="also open the store, ping Redis and connect to each provider's host"
    )
    check.set_defaults(func=_check)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
