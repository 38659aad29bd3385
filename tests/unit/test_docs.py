"""The documentation: the generated configuration reference matches the code and covers every key, the local
providers' ready config parses, and the links of README.md and docs/ point at files that exist (issue 33, item 5).
``mkdocs build --strict`` (.ci/run) checks the site's links and nav as well."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import msgspec.inspect as mi
import yaml

from gateway import settings
from gateway.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = ".venv/bin/python tools/config_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "tools" / "config_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("config_reference", module)
    spec.loader.exec_module(module)
    return module


def _reachable(t: Any, found: dict[type, mi.StructType]) -> None:
    """Every Struct a type holds, recursively (msgspec's own view of the config, independent of the generator)."""
    if isinstance(t, mi.Metadata):
        _reachable(t.type, found)
    elif isinstance(t, mi.StructType):
        if t.cls in found:
            return
        found[t.cls] = t
        for f in t.fields:
            _reachable(f.type, found)
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            _reachable(member, found)
    elif isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType | mi.TupleType):
        for item in getattr(t, "item_types", None) or (t.item_type,):  # type: ignore[union-attr]
            _reachable(item, found)
    elif isinstance(t, mi.DictType):
        _reachable(t.key_type, found)
        _reachable(t.value_type, found)


def test_configuration_reference_is_current() -> None:
    page = ROOT / "docs" / "configuration.md"
    fresh = _generator().render()
    assert page.read_text() == fresh, f"docs/configuration.md is out of date: run {REGENERATE}"
    assert REGENERATE in fresh  # the page says how it is made


def test_configuration_reference_covers_every_field() -> None:
    generator = _generator()
    found: dict[type, mi.StructType] = {}
    _reachable(mi.type_info(Settings), found)
    assert settings.ServerSettings in found and settings.FoundryProvider in found and settings.Budget in found
    sections = {section.cls: section for section in generator.sections()}
    assert set(sections) == set(found), "a Struct reachable from Settings has no section (or one too many)"
    page = (ROOT / "docs" / "configuration.md").read_text()
    for cls, info in found.items():
        section = sections[cls]
        documented = {row.key for row in section.rows}
        expected = {f.encode_name for f in info.fields} | ({info.tag_field} if info.tag_field else set())
        assert documented == expected, f"{cls.__name__}: documented {sorted(documented)}, has {sorted(expected)}"
        for row in section.rows:
            assert f"| `{row.path}` |" in page, f"no row for {row.path}"
            field = next((f for f in info.fields if f.encode_name == row.key), None)
            if field is not None and field.required:
                assert row.default == "required", row
            elif (
                field is not None
                and field.default is not msgspec.NODEFAULT
                and not isinstance(field.default, msgspec.Struct)
            ):
                assert msgspec.json.encode(field.default).decode() in row.default.replace(" ", ""), row
    # a few paths as a reader looks them up
    for path in ("server.port", "providers.<name>.kind", "models.<alias>.targets[].provider", "auth.keys[].name"):
        assert f"| `{path}` |" in page, path
    # an enum lists its allowed values, in the source's order
    assert "one of `fallback`, `weighted`, `round_robin`, `least_latency`" in page


def test_local_providers_config_parses() -> None:
    path = ROOT / "config" / "local-providers.yaml"
    loaded = load_settings(path, environ={})
    kinds = {type(p).__name__ for p in loaded.providers.values()}
    assert {"AnthropicProvider", "BedrockProvider", "VertexProvider", "FoundryProvider"} <= kinds
    page = (ROOT / "docs" / "local-providers.md").read_text()
    assert "config/local-providers.yaml" in page
    for alias in loaded.models:
        if "*" not in alias:
            assert f"`{alias}`" in page, f"docs/local-providers.md does not name the alias {alias}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # not inside code blocks
    return [m.group(1) for m in _LINK.finditer(text)]


def test_readme_links_are_relative_and_exist() -> None:
    """README.md's links into docs/ are relative paths to files that exist, so they work on GitHub as on disk."""
    links = [link for link in _links(ROOT / "README.md") if not link.startswith(("http://", "https://", "#"))]
    assert any(link.startswith("docs/") for link in links), "the README has no table of contents into docs/"
    for link in links:
        target = link.split("#", 1)[0]
        assert not target.startswith("/"), f"README.md links {link}: use a relative path"
        assert (ROOT / target).exists(), f"README.md links {link}, which does not exist"


def test_docs_links_exist() -> None:
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for link in _links(page):
            if link.startswith(("http://", "https://", "#", "mailto:")):
                continue
            target = (page.parent / link.split("#", 1)[0]).resolve()
            assert target.exists(), f"{page.relative_to(ROOT)} links {link}, which does not exist"


def test_readme_quick_start_commands() -> None:
    """The two commands of the front page, byte for byte (a fresh clone's whole set-up)."""
    readme = (ROOT / "README.md").read_text()
    assert (
        "python3.11 -m venv .venv && .venv/bin/pip install -c requirements/constraints.txt -e . "
        "&& .venv/bin/messages-gateway serve\n"
    ) in readme
    assert (
        "python3.11 -m venv .venv && .venv/bin/pip install -c requirements/constraints.txt -e '.[test]' "
        "&& .venv/bin/pytest -m 'not long' && .venv/bin/pytest -m long -n 12\n"
    ) in readme
    assert "anthropic[bedrock]" in readme or "anthropic[bedrock]" in (ROOT / "docs" / "clients.md").read_text()


def test_mkdocs_nav_names_existing_pages() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["name"] == "material"
    assert config.get("strict") is True

    def pages(nav: Any) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    listed = pages(config["nav"])
    for page in listed:
        assert (ROOT / "docs" / page).exists(), page
    for page in ("configuration.md", "local-providers.md", "design.md", "wire-formats.md", "benchmarks.md"):
        assert page in listed, page


def test_docs_extra_is_pinned() -> None:
    """The `docs` extra (mkdocs, Material) is pinned in requirements/constraints.txt, as .ci/run installs it."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    for requirement in map(Requirement, extras["docs"]):
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"{requirement.name} is not pinned in requirements/constraints.txt"
        assert requirement.specifier.contains(pins[name]), (str(requirement), pins[name])
