"""The metrics' lock-free values (``PlainValue``) expose the same bytes as prometheus-client's own ``MutexValue``
for the same updates, and are not used in multiprocess mode."""

from __future__ import annotations

import pytest
from prometheus_client import values

from gateway.observability import metrics as metrics_module
from gateway.observability.metrics import Metrics, PlainValue
from gateway.wire.events import Usage


def exercise(m: Metrics) -> bytes:
    for n in range(50):
        m.record_request(
            alias="sonnet",
            provider="claude" if n % 3 else "bedrock",
            model="claude-sonnet-4-6",
            outcome="completed" if n % 7 else "upstream_error",
            usage=Usage(
                input_tokens=n, output_tokens=2 * n, cache_read_input_tokens=n % 5, cache_creation_input_tokens=0
            ),
            duration=0.001 * n,
            time_to_first_token=0.0005 * n if n % 2 else None,
            cost=0.01 * n if n % 4 else None,
        )
        m.inflight.inc()
        m.added_latency.labels("sonnet", "claude").observe(0.0003 * n)
        m.upstream_errors.labels("claude", "overloaded_error").inc()
        m.inflight.dec()
    m.ledger_queue(7)
    lines = m.render().decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line).encode()  # creation times differ


def test_the_same_exposition_as_prometheus_clients_own_values(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = Metrics()
    assert isinstance(plain.inflight._value, PlainValue)
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setattr(metrics_module, "use_plain_values", lambda: None)
    mutex = Metrics()
    assert type(mutex.inflight._value) is values.MutexValue
    assert exercise(plain) == exercise(mutex)


def test_not_in_multiprocess_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setattr(values, "ValueClass", values.MutexValue)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    metrics_module.use_plain_values()
    assert values.ValueClass is values.MutexValue
