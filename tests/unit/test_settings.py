"""Configuration: strict keys with lines, environment interpolation, glob aliases, references."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.routing.table import RouteTable
from gateway.settings import (
    AnthropicProvider,
    ConfigError,
    MockProvider,
    default_config_path,
    load_settings,
    parse_settings,
)
from gateway.wire.errors import NotFound

BASE = """\
server: {host: 127.0.0.1, port: 8080}
auth:
  keys: ["${GATEWAY_API_KEY}"]
providers:
  anthropic: {kind: anthropic, api_key: "${ANTHROPIC_API_KEY}", base_url: "${UPSTREAM:-https://api.anthropic.com}"}
  demo: {kind: mock}
models:
  claude-sonnet-4-5:
    targets:
      - {provider: anthropic, model: claude-sonnet-4-5-20250929}
  "claude-*":
    targets: [{provider: anthropic}]
  "*":
    targets: [{provider: demo}]
"""
ENV = {"GATEWAY_API_KEY": "gw-key", "ANTHROPIC_API_KEY": "sk-ant"}


def test_interpolation_from_the_environment() -> None:
    s = parse_settings(BASE, environ=ENV)
    assert s.auth.keys == ["gw-key"]
    provider = s.providers["anthropic"]
    assert isinstance(provider, AnthropicProvider)
    assert provider.api_key == "sk-ant"
    assert provider.base_url == "https://api.anthropic.com"
    s = parse_settings(BASE, environ={**ENV, "UPSTREAM": "http://127.0.0.1:9"})
    assert s.providers["anthropic"].base_url == "http://127.0.0.1:9"  # type: ignore[union-attr]


def test_empty_variable_takes_the_default_and_dollar_escapes() -> None:
    s = parse_settings(
        BASE.replace('api_key: "${ANTHROPIC_API_KEY}"', 'api_key: "$${LITERAL}"'), environ={**ENV, "UPSTREAM": ""}
    )
    assert s.providers["anthropic"].base_url == "https://api.anthropic.com"  # type: ignore[union-attr]
    assert s.providers["anthropic"].api_key == "${LITERAL}"  # type: ignore[union-attr]


def test_missing_environment_variable_names_it_and_its_line() -> None:
    with pytest.raises(ConfigError, match=r"gw.yaml:5: environment variable ANTHROPIC_API_KEY is not set"):
        parse_settings(BASE, source="gw.yaml", environ={"GATEWAY_API_KEY": "x"})


def test_unknown_key_names_key_and_line() -> None:
    text = BASE.replace("  demo: {kind: mock}", "  demo:\n    kind: mock\n    delats: 3")
    with pytest.raises(ConfigError, match=r"gw.yaml:8: unknown key 'delats' in providers.demo"):
        parse_settings(text, source="gw.yaml", environ=ENV)


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError, match=r":15: unknown key 'routes'"):
        parse_settings(BASE + "routes: {}\n", environ=ENV)


def test_wrong_type_names_the_path() -> None:
    with pytest.raises(ConfigError, match=r"Expected `int`, got `str` at server.port"):
        parse_settings(BASE.replace("port: 8080", "port: eighty"), environ=ENV)


def test_unknown_provider_kind() -> None:
    with pytest.raises(ConfigError, match=r"providers.demo.kind"):
        parse_settings(BASE.replace("kind: mock", "kind: mystery"), environ=ENV)


def test_target_must_name_a_known_provider() -> None:
    with pytest.raises(ConfigError, match=r":10: model 'claude-sonnet-4-5' targets unknown provider 'nope'"):
        parse_settings(BASE.replace("{provider: anthropic, model", "{provider: nope, model"), environ=ENV)


def test_invalid_yaml() -> None:
    with pytest.raises(ConfigError, match="invalid YAML"):
        parse_settings("server: [", environ=ENV)


def test_duplicate_keys_are_errors() -> None:
    with pytest.raises(ConfigError, match="duplicate key 'server'"):
        parse_settings(BASE + "server: {}\n", environ=ENV)


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


def test_glob_aliases_resolve_in_order_after_exact_names() -> None:
    s = parse_settings(BASE, environ=ENV)
    table = RouteTable(s.models, {name: _Named(name) for name in s.providers})  # type: ignore[misc]
    exact = table.resolve("claude-sonnet-4-5")
    assert exact.alias == "claude-sonnet-4-5"
    assert exact.targets[0].upstream_model("claude-sonnet-4-5") == "claude-sonnet-4-5-20250929"
    glob = table.resolve("claude-opus-4-1")
    assert glob.alias == "claude-*" and glob.targets[0].upstream_model("claude-opus-4-1") == "claude-opus-4-1"
    assert table.resolve("gpt-4").alias == "*"
    assert [r.alias for r in table.aliases()] == ["claude-sonnet-4-5"]


def test_unknown_model_is_not_found() -> None:
    s = parse_settings(BASE.replace('  "*":\n    targets: [{provider: demo}]\n', ""), environ=ENV)
    table = RouteTable(s.models, {name: _Named(name) for name in s.providers})  # type: ignore[misc]
    with pytest.raises(NotFound):
        table.resolve("gpt-4")


# every variable the shipped configs read (config/production.example.yaml reads the most)
SHIPPED_ENV = {
    "GATEWAY_API_KEY": "k",
    "ANTHROPIC_API_KEY": "k",
    "GATEWAY_ADMIN_KEY": "k",
    "AWS_REGION": "us-east-1",
    "PGPASSWORD": "k",
    "REDIS_PASSWORD": "k",
}


def test_shipped_configs_are_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_API_KEY", raising=False)
    default = load_settings(default_config_path())
    assert all(isinstance(p, MockProvider) for p in default.providers.values()), "the default runs offline"
    assert default.auth.keys == [] and default.auth.open  # open, and saying so
    root = Path(__file__).resolve().parents[2] / "config"
    for path in root.glob("*.yaml"):
        load_settings(path, environ=SHIPPED_ENV)


def test_check_config_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    good = tmp_path / "good.yaml"
    good.write_text(BASE.replace("${GATEWAY_API_KEY}", "k").replace("${ANTHROPIC_API_KEY}", "k"))
    assert main(["check-config", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("servr: {}\n")
    assert main(["check-config", str(bad)]) == 2
    assert "bad.yaml:1: unknown key 'servr'" in capsys.readouterr().err
