"""The prices a cost is counted with (gateway/governance/pricing.py): the config's ``pricing`` first, then the shipped
Claude list prices, in every provider's spelling of a model id, matched exactly; Bedrock's regional premium; the
long-context tiers."""

from __future__ import annotations

import pytest

from gateway.governance.limits import unpriced_routes
from gateway.governance.pricing import BUILTIN_PRICES, REGIONAL_PREMIUM, Prices, base_name, builtin_price
from gateway.settings import LongContextPrice, Price, parse_settings
from gateway.wire.events import Usage
from gateway.wire.usage_fold import cost_of


@pytest.mark.parametrize(
    ("model", "base", "regional"),
    [
        ("claude-opus-5-5", "claude-opus-5-5", False),
        ("claude-sonnet-4-5-20250929", "claude-sonnet-4-5", False),  # a dated snapshot
        ("claude-3-5-haiku-latest", "claude-3-5-haiku", False),
        ("claude-opus-4-0", "claude-opus-4", False),  # the alias of claude-opus-4-20250514
        ("claude-sonnet-4-5@20250929", "claude-sonnet-4-5", False),  # Vertex
        ("claude-opus-4-5@20251101", "claude-opus-4-5", False),
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5", True),  # Bedrock, one Region
        ("anthropic.claude-opus-5-5", "claude-opus-5-5", True),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "claude-sonnet-4-5", True),  # a geographic profile
        ("eu.anthropic.claude-haiku-4-5-20251001-v1:0", "claude-haiku-4-5", True),
        ("apac.anthropic.claude-sonnet-4-6", "claude-sonnet-4-6", True),
        ("us-gov.anthropic.claude-3-7-sonnet-20250219-v1:0", "claude-3-7-sonnet", True),
        ("global.anthropic.claude-opus-4-6-v1", "claude-opus-4-6", False),  # the global profile: list price
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.anthropic.claude-sonnet-4-6",
            "claude-sonnet-4-6",
            False,
        ),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-sonnet-4-6",
            "claude-sonnet-4-6",
            True,
        ),
    ],
)
def test_each_providers_spelling_has_its_base_name(model: str, base: str, regional: bool) -> None:
    assert base_name(model) == (base, regional)
    assert builtin_price(model) is not None


@pytest.mark.parametrize(
    ("model", "priced_as"),
    [
        ("claude-fable-5-1", "claude-fable-5-1"),
        ("claude-fable-5", "claude-fable-5"),
        ("claude-fable-5-20260609", "claude-fable-5"),
        ("claude-sonnet-5-5-20261001", "claude-sonnet-5-5"),  # never the neighbouring claude-sonnet-5
        ("claude-sonnet-5", "claude-sonnet-5"),
        ("claude-mythos-5-2", "claude-fable-5-2"),  # Mythos shares Fable's prices
    ],
)
def test_a_base_name_is_matched_whole_never_as_a_prefix(model: str, priced_as: str) -> None:
    assert builtin_price(model) == BUILTIN_PRICES[priced_as][0]


@pytest.mark.parametrize(
    "model",
    ["claude-opus-6", "claude-opus-5-5-turbo", "claude-fable-5-3", "gpt-4o", "anthropic.titan", "mock-model", ""],
)
def test_a_name_the_table_does_not_know_has_no_price(model: str) -> None:
    assert builtin_price(model) is None


def test_list_prices_as_anthropic_publishes_them() -> None:
    """US dollars per MTok: input, 5-minute cache write, cache read, output (platform.claude.com, 2026-12-02)."""
    expected = {
        "claude-opus-5-5": (4, 5, 0.20, 20),
        "claude-opus-4-6": (5, 6.25, 0.50, 25),
        "claude-opus-4-1": (15, 18.75, 1.50, 75),
        "claude-sonnet-5-5": (2, 2.50, 0.10, 10),
        "claude-sonnet-5": (2, 2.50, 0.20, 10),
        "claude-sonnet-4-6": (3, 3.75, 0.30, 15),
        "claude-haiku-5-5": (0.10, 0.125, 0.01, 0.50),
        "claude-haiku-4-5": (1, 1.25, 0.10, 5),
        "claude-3-haiku": (0.25, 0.30, 0.03, 1.25),
        "claude-fable-5-2": (8, 10, 0.20, 40),
        "claude-fable-5-1": (10, 12.50, 0.25, 50),
        "claude-fable-5": (10, 12.50, 1.00, 50),
    }
    for name, (input_, write, read, output) in expected.items():
        price = builtin_price(name)
        assert price is not None, name
        assert (price.input, price.cache_creation, price.cache_read, price.output) == (input_, write, read, output)
    for name, (price, _) in BUILTIN_PRICES.items():  # a 5-minute write is 1.25 times input, everywhere
        assert price.cache_creation == pytest.approx(price.input * 1.25, rel=0.05), name


def test_bedrocks_regional_endpoints_cost_ten_percent_more_from_sonnet_4_5_on() -> None:
    global_ = builtin_price("global.anthropic.claude-sonnet-4-5-20250929-v1:0")
    geo = builtin_price("us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    assert global_ is not None and geo is not None
    assert global_ == builtin_price("claude-sonnet-4-5")
    assert geo.input == pytest.approx(3 * REGIONAL_PREMIUM) and geo.output == pytest.approx(15 * REGIONAL_PREMIUM)
    assert geo.long_context is not None and geo.long_context.input == pytest.approx(6 * REGIONAL_PREMIUM)
    # older models: one price wherever they are served
    assert builtin_price("us.anthropic.claude-3-7-sonnet-20250219-v1:0") == builtin_price("claude-3-7-sonnet")


def test_the_long_context_tier_prices_every_token_of_a_long_request() -> None:
    price = builtin_price("claude-sonnet-4-5")
    assert price is not None
    short = Usage(input_tokens=100_000, cache_read_input_tokens=100_000, output_tokens=1000)
    assert cost_of(short, price) == pytest.approx((100_000 * 3 + 100_000 * 0.30 + 1000 * 15) / 1e6)
    long = Usage(input_tokens=100_000, cache_read_input_tokens=100_001, output_tokens=1000)  # 200,001 input tokens
    assert cost_of(long, price) == pytest.approx((100_000 * 6 + 100_001 * 0.60 + 1000 * 22.50) / 1e6)
    haiku = builtin_price("claude-haiku-5-5")
    assert haiku is not None
    assert cost_of(Usage(input_tokens=100_001, output_tokens=10), haiku) == pytest.approx(
        (100_001 * 0.50 + 10 * 2.50) / 1e6
    )
    assert cost_of(Usage(input_tokens=100_000, output_tokens=10), haiku) == pytest.approx(
        (100_000 * 0.10 + 10 * 0.50) / 1e6
    )


def test_the_configs_pricing_is_matched_first_and_the_table_after() -> None:
    negotiated = Price(input=1, output=2)
    prices = Prices({"claude-opus-5-5": negotiated, "fake-*": Price(input=3, output=15)})
    assert prices.price_of("claude-opus-5-5") is negotiated
    assert prices.price_of("claude-sonnet-4-6") == builtin_price("claude-sonnet-4-6")
    assert prices.price_of("fake-text") == Price(input=3, output=15)
    assert prices.price_of("claude-opus-6") is None
    config_only = Prices({"fake-*": Price(input=3)}, builtin=False)
    assert config_only.price_of("claude-opus-5-5") is None
    assert not Prices(builtin=False) and Prices()


def test_pricing_in_yaml_takes_a_long_context_tier() -> None:
    settings = parse_settings(
        "auth: {open: true}\npricing:\n  my-model: {input: 1, output: 2,"
        " long_context: {above_input_tokens: 1000, input: 2, output: 4}}\n"
    )
    assert settings.pricing["my-model"].long_context == LongContextPrice(above_input_tokens=1000, input=2, output=4)
    assert settings.builtin_pricing


def test_check_config_lists_the_globs_that_can_reach_unpriced_names() -> None:
    settings = parse_settings(
        """
auth: {keys: [{name: a, key: sk-a, limits: {budget: {usd: 1, per: day}}}]}
providers: {claude: {kind: anthropic, api_key: k}}
models:
  "claude-*": {targets: [{provider: claude}]}
  opus: {targets: [{provider: claude, model: claude-opus-5-5}]}
  bedrock-opus: {targets: [{provider: claude, model: us.anthropic.claude-opus-4-6-v1}]}
  future: {targets: [{provider: claude, model: claude-opus-6}]}
"""
    )
    warnings = unpriced_routes(settings)
    assert len(warnings) == 2, warnings
    assert "route 'claude-*' passes the client's model names through" in warnings[0]
    assert "the shipped Claude table" in warnings[0]
    assert "route 'future': target model 'claude-opus-6' has no price" in warnings[1]
