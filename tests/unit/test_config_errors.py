"""Every config error names the real line, the path with map keys, an enum's allowed values and a did-you-mean for
an unknown key; ``${VAR}`` fills any scalar and is then type-checked (issue 33, item 2: the list there is this file's
list of tests). The value itself is never quoted: it may be a secret."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import ConfigError, parse_settings

OPEN = "auth: {open: true}\n"


def error_of(text: str, **environ: str) -> str:
    with pytest.raises(ConfigError) as raised:
        parse_settings(text, source="gateway.yaml", environ=environ)
    return str(raised.value)


def test_an_error_under_teams_names_the_team_and_its_line() -> None:
    text = OPEN + "teams:\n  infra: {}\n  payments:\n    limits:\n      budget: {usd: lots}\n"
    assert error_of(text) == "gateway.yaml:6: Expected `float`, got `str` at teams.payments.limits.budget.usd"
    text = OPEN + "teams:\n  payments:\n    limit: {requests_per_minute: 5}\n"
    assert error_of(text) == "gateway.yaml:4: unknown key 'limit' in teams.payments (did you mean 'limits'?)"


def test_an_error_under_pricing_names_the_model_even_with_dots_in_it() -> None:
    text = OPEN + "pricing:\n  claude-3.5-x: {input: 1}\n  fake-*:\n    input: -1\n"
    assert error_of(text) == "gateway.yaml:5: Expected `float` >= 0.0 at pricing.fake-*.input"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            OPEN + "teams:\n  pay:\n    limits:\n      budget: {usd: 5, per: monthly}\n",
            "gateway.yaml:5: Invalid enum value at teams.pay.limits.budget.per: use one of day, month, week",
        ),
        (
            OPEN + "providers:\n  bedrock:\n    kind: aws-bedrock\n",
            "gateway.yaml:4: Invalid value at providers.bedrock.kind: use one of anthropic, mock, bedrock, "
            "bedrock_mantle, claude_aws, vertex, foundry",
        ),
        (
            OPEN + "providers: {p: {kind: mock}}\nmodels:\n  m:\n    targets: [{provider: p}]\n"
            "    max_tokens_policy: clip\n",
            "gateway.yaml:6: Invalid enum value at models.m.max_tokens_policy: use one of clamp, reject",
        ),
        (
            OPEN + "metrics:\n  labels: [key, user]\n",
            "gateway.yaml:3: Invalid enum value at metrics.labels[1]: use one of key, team",
        ),
    ],
)
def test_an_enum_error_lists_the_allowed_values(text: str, expected: str) -> None:
    message = error_of(text)
    assert message == expected
    assert "monthly" not in message and "aws-bedrock" not in message and "clip" not in message  # never the value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OPEN + "server:\n  prot: 8080\n", "gateway.yaml:3: unknown key 'prot' in server (did you mean 'port'?)"),
        (OPEN + "model: {}\n", "gateway.yaml:2: unknown key 'model' in the top level (did you mean 'models'?)"),
        (
            OPEN + "providers:\n  claude:\n    kind: anthropic\n    api_kye: k\n",
            "gateway.yaml:5: unknown key 'api_kye' in providers.claude (did you mean 'api_key'?)",
        ),
        (OPEN + "server:\n  zzz: 1\n", "gateway.yaml:3: unknown key 'zzz' in server"),  # nothing close: no guess
    ],
)
def test_an_unknown_key_gets_a_did_you_mean(text: str, expected: str) -> None:
    assert error_of(text) == expected


def test_references_name_their_line_and_the_near_miss() -> None:
    text = "teams: {pay: {}, infra: {}}\nauth:\n  keys:\n    - {name: a, key: sk-a}\n"
    text += "    - {name: b, key: sk-b, team: pai}\n"
    assert error_of(text) == (
        "gateway.yaml:5: key 'b' names team 'pai', which `teams` does not list (did you mean 'pay'?) "
        "(teams: infra, pay) at auth.keys[1].team"
    )
    text = OPEN + "providers: {claude: {kind: mock}}\nmodels:\n  m: {targets: [{provider: cluade}]}\n"
    assert "model 'm' targets unknown provider 'cluade' (did you mean 'claude'?)" in error_of(text)
    assert error_of("server: {port: 8080}\n").startswith("gateway.yaml:1: no auth.keys")


def test_a_variable_fills_a_number_a_bool_and_an_optional_and_is_then_checked() -> None:
    text = 'auth:\n  open: ${OPEN}\nserver:\n  port: ${PORT}\n  drain_timeout_s: "${DRAIN:-12.5}"\n'
    text += "  max_inflight: ${INFLIGHT:-}\n"
    settings = parse_settings(text, environ={"OPEN": "true", "PORT": "9090"})
    assert (settings.auth.open, settings.server.port, settings.server.drain_timeout_s) == (True, 9090, 12.5)
    assert settings.server.max_inflight is None  # an empty value where the field may be unset: unset
    other = parse_settings(text.replace("open: ${OPEN}", "keys: [sk-a]"), environ={"PORT": "1", "INFLIGHT": "7"})
    assert (other.server.port, other.server.max_inflight) == (1, 7)
    assert parse_settings(OPEN + "server: {ui: '${UI}'}\n", environ={"UI": "off"}).server.ui is False
    # filled, then type-checked as if written there
    too_big = error_of(OPEN + "server:\n  port: ${PORT}\n", PORT="70000")
    assert too_big.startswith("gateway.yaml:3: Expected `int` <= 65535")
    message = error_of(OPEN + "server:\n  port: ${PORT}\n", PORT="eighty")
    assert message == "gateway.yaml:3: ${PORT} must fill an integer, and the environment's value is not"
    assert "eighty" not in message


def test_a_variable_in_a_text_field_stays_text() -> None:
    """A numeric secret in a key field is the key's text, not a number (the field's type decides, not the value)."""
    settings = parse_settings(
        "auth:\n  keys: ['${KEY}']\nserver: {host: '${HOST}'}\n", environ={"KEY": "12345", "HOST": "1"}
    )
    assert settings.auth.keys == ["12345"] and settings.server.host == "1"


def test_check_config_prints_the_same_error(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(OPEN + "teams:\n  pay:\n    limits:\n      budget: {usd: 5, per: monthly}\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert f"{config}:5: Invalid enum value at teams.pay.limits.budget.per: use one of day, month, week" in done.stderr
