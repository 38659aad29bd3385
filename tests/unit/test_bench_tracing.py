"""``bench.run``'s tracing comparison: the traced gateway's config (``--tracing-options`` included) is one the gateway
reads, and ``--tracing-together`` measures a pair's two windows at the same time (both phases under way at once),
where the default alternates them — each pair with both gateways' CPU per unit and rates."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench import run
from gateway.observability.otlp_export import export_config
from gateway.settings import parse_settings


def test_the_traced_gateways_config_with_options_is_read_by_the_gateway() -> None:
    yaml = run.gateway_config(8080, 9000) + run.tracing_yaml(4318, "sample_ratio: 0.0; signals: [traces]")
    config = export_config(parse_settings(yaml, environ={}), environ={})
    assert config is not None
    assert config.endpoint == "http://127.0.0.1:4318" and config.protocol == "http/protobuf"
    assert config.sample_ratio == 0.0 and config.traces and not config.metrics
    plain = export_config(parse_settings(run.gateway_config(8080, 9000) + run.tracing_yaml(4318), environ={}), {})
    assert plain is not None and plain.sample_ratio == 1.0 and plain.metrics


@pytest.mark.parametrize("together", [False, True])
def test_pairs_alternate_or_run_together(monkeypatch: pytest.MonkeyPatch, together: bool) -> None:
    running: set[str] = set()
    overlapped: list[bool] = []

    async def measure(system: Any, name: str, load: Any, *, label: str) -> dict[str, Any]:
        running.add(name)
        await asyncio.sleep(0.01)
        overlapped.append(len(running) == 2)  # the other gateway's window under way too
        await asyncio.sleep(0.04)
        running.discard(name)
        cpu = 0.3 if name == run.TRACED else 0.2
        return {"cpu_ms_per_request": cpu, "rps": 1000.0 / cpu, "errors": 0}

    monkeypatch.setattr(run, "measure", measure)
    monkeypatch.setattr(run.asyncio, "sleep", _quick_sleep(asyncio.sleep))
    opts = run.Options(
        quick=True, soak_s=0, ttft_repeats=1, ttft_requests=1, litellm=False, tracing_pairs=3, tracing_together=together
    )
    pairs = asyncio.run(run._tracing_pairs(None, run.BY_NAME["json-c10"], opts))  # type: ignore[arg-type]
    assert [p["order"][0] for p in pairs] == ["gateway", run.TRACED, "gateway"]
    assert all(p["off_us"] == 200.0 and p["on_us"] == 300.0 and p["difference_us"] == 100.0 for p in pairs)
    assert all(p["off_rps"] == 5000.0 and p["on_rps"] == pytest.approx(3333.3, abs=0.1) for p in pairs)
    assert any(overlapped) is together and all(overlapped) is together


def _quick_sleep(sleep: Any) -> Any:
    async def quick(delay: float) -> None:
        await sleep(min(delay, 0.05))

    return quick
