"""Write docs/configuration.md, the configuration reference, from the config Structs of ``gateway/settings.py``.

Every key reachable from ``Settings`` gets a row: its path (``server.port``, ``providers.<name>.kind``), its type
(with the bounds and the allowed values of a ``Literal``), its default and its description. The description is
the comment beside the field, or the comment lines right above it, read from the source with ``tokenize``; a
class's docstring introduces its section. Nothing is written by hand, so the page cannot drift from the code
(``tests/unit/test_docs.py`` fails when the committed page differs from a fresh generation).

    .venv/bin/python tools/config_reference.py            # rewrite docs/configuration.md
    .venv/bin/python tools/config_reference.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gateway import settings as settings_module  # noqa: E402

OUTPUT = ROOT / "docs" / "configuration.md"
SOURCE = Path(settings_module.__file__)
COMMAND = ".venv/bin/python tools/config_reference.py"

#: the placeholder each map's keys get in a path
MAP_KEYS = {"providers": "<name>", "models": "<alias>", "pricing": "<model>", "teams": "<team>"}


@dataclass
class Row:
    key: str  # the field's own name (or the tag field's)
    path: str  # the full dotted path
    type: str
    default: str
    description: str


@dataclass
class Section:
    cls: type
    path: str  # where it is first reached
    also: list[str] = field(default_factory=list)  # other paths that hold the same Struct
    tag: tuple[str, str] | None = None  # (tag field, tag value) of a tagged union's variant
    rows: list[Row] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        name = self.cls.__name__.lower()
        return f"{name}-{self.tag[1]}".replace("_", "-") if self.tag else name


# -- the source: comments and docstrings --------------------------------------------------------------------------


class _Source:
    """Comments and docstrings of gateway/settings.py, by class and field."""

    def __init__(self, path: Path) -> None:
        text = path.read_text()
        self.tree = ast.parse(text)
        self.comments: dict[int, str] = {}  # line -> comment text
        self.code_lines: set[int] = set()  # lines holding code (not only a comment)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                self.comments[tok.start[0]] = tok.string.lstrip("#").strip()
            elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                self.code_lines.update(range(tok.start[0], tok.end[0] + 1))
        self.classes = {node.name: node for node in self.tree.body if isinstance(node, ast.ClassDef)}

    def docstring(self, cls: type) -> str:
        node = self.classes.get(cls.__name__)
        return (ast.get_docstring(node) or "") if node is not None else ""

    def field_comment(self, cls: type, name: str) -> str:
        """The comment lines right above the field and the comment at the end of its statement, in the first class
        of ``cls``'s MRO that defines it."""
        for klass in cls.__mro__:
            node = self.classes.get(klass.__name__)
            if node is None:
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
                    return self._comment_of(stmt)
        return ""

    def _comment_of(self, stmt: ast.stmt) -> str:
        above: list[str] = []
        line = stmt.lineno - 1
        while line in self.comments and line not in self.code_lines:
            above.insert(0, self.comments[line])
            line -= 1
        end = stmt.end_lineno or stmt.lineno
        trailing = [self.comments[n] for n in range(stmt.lineno, end + 1) if n in self.comments]
        return " ".join([*above, *trailing]).strip()


class SourceCache:
    """The parsed source, read once."""

    _source: _Source | None = None

    @classmethod
    def get(cls) -> _Source:
        if cls._source is None:
            cls._source = _Source(SOURCE)
        return cls._source


# -- types and defaults -------------------------------------------------------------------------------------------


def _bounds(t: Any) -> str:
    parts = []
    for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
        value = getattr(t, attr, None)
        if value is not None:
            parts.append(f"{sign} {_number(value)}")
    return f" ({', '.join(parts)})" if parts else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _string(t: mi.StrType) -> str:
    extra = []
    if t.min_length == 1:
        extra.append("not empty")
    elif t.min_length is not None:
        extra.append(f"at least {t.min_length} characters")
    if t.max_length is not None:
        extra.append(f"at most {t.max_length} characters")
    if t.pattern is not None:
        extra.append(f"matching `{t.pattern}`")
    return "string" + (f" ({', '.join(extra)})" if extra else "")


def _literal_order(cls: type, name: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A Literal's values in source order (msgspec sorts them)."""
    try:
        hint = typing.get_type_hints(cls, vars(settings_module), include_extras=True).get(name)
    except Exception:
        return values
    stack = [hint]
    while stack:
        current = stack.pop()
        if typing.get_origin(current) is typing.Literal:
            args = typing.get_args(current)
            if set(args) == set(values):
                return args
        stack.extend(typing.get_args(current))
    return values


class _Types:
    """Renders a msgspec type; records the Structs it names (to give each a section)."""

    def __init__(self, sections: dict[type, Section]) -> None:
        self.sections = sections

    def render(self, t: Any, owner: type, name: str) -> str:
        if isinstance(t, mi.Metadata):
            return self.render(t.type, owner, name)
        if isinstance(t, mi.UnionType):
            rendered = [self.render(member, owner, name) for member in t.types]
            return " or ".join(dict.fromkeys(rendered))
        if isinstance(t, mi.NoneType):
            return "null"
        if isinstance(t, mi.BoolType):
            return "boolean"
        if isinstance(t, mi.IntType):
            return "integer" + _bounds(t)
        if isinstance(t, mi.FloatType):
            return "number" + _bounds(t)
        if isinstance(t, mi.StrType):
            return _string(t)
        if isinstance(t, mi.LiteralType):
            values = _literal_order(owner, name, t.values)
            return "one of " + ", ".join(f"`{v}`" for v in values)
        if isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
            size = " (at least one)" if getattr(t, "min_length", None) else ""
            return f"list{size} of {self.render(t.item_type, owner, name)}"
        if isinstance(t, mi.DictType):
            return f"map of {self.render(t.key_type, owner, name)} to {self.render(t.value_type, owner, name)}"
        if isinstance(t, mi.StructType):
            section = self.sections.get(t.cls)
            label = t.cls.__name__ + (f" (`{t.tag_field}: {t.tag}`)" if t.tag is not None else "")
            return f"[{label}](#{section.anchor})" if section is not None else label
        return type(t).__name__.removesuffix("Type").lower()


def _default(f: mi.Field) -> str:
    if f.required:
        return "required"
    value = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
    if isinstance(value, msgspec.Struct):
        return "(its defaults)"
    text = f"`{json.dumps(msgspec.to_builtins(value), ensure_ascii=False)}`"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 and value % 1024 == 0:
        kib = value // 1024
        text += f" ({kib // 1024} MiB)" if kib % 1024 == 0 else f" ({kib} KiB)"
    return text


def _prose(text: str) -> str:
    """A comment or docstring as one Markdown table cell: rST ``code`` as `code`, no pipes, one line."""
    text = " ".join(text.split())
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    text = re.sub(r":(?:class|func|data|attr|meth):`~?([^`]+)`", r"`\1`", text)
    return text.replace("|", "\\|")


# -- the walk -----------------------------------------------------------------------------------------------------


def _structs_in(t: Any, path: str, key: str) -> Iterator[tuple[mi.StructType, str]]:
    """The Structs a field's type holds, each with the path of one of its instances."""
    if isinstance(t, mi.Metadata):
        yield from _structs_in(t.type, path, key)
    elif isinstance(t, mi.StructType):
        yield t, path
    elif isinstance(t, mi.UnionType):
        for member in t.types:
            yield from _structs_in(member, path, key)
    elif isinstance(t, mi.ListType | mi.VarTupleType | mi.SetType | mi.FrozenSetType):
        yield from _structs_in(t.item_type, f"{path}[]", key)
    elif isinstance(t, mi.DictType):
        yield from _structs_in(t.value_type, f"{path}.{MAP_KEYS.get(key, '<key>')}", key)


def sections(root: type = settings_module.Settings) -> list[Section]:
    """Every Struct reachable from ``root``, breadth first, each once (at the first path that reaches it)."""
    found: dict[type, Section] = {}
    infos: dict[type, mi.StructType] = {}
    queue: list[tuple[mi.StructType, str]] = [(typing.cast(mi.StructType, mi.type_info(root)), "")]
    while queue:
        info, path = queue.pop(0)
        if info.cls in found:
            if path not in found[info.cls].also and path != found[info.cls].path:
                found[info.cls].also.append(path)
            continue
        tag = (info.tag_field, str(info.tag)) if info.tag_field is not None and info.tag is not None else None
        found[info.cls] = Section(info.cls, path, tag=tag)
        infos[info.cls] = info
        for f in info.fields:
            child = f"{path}.{f.encode_name}" if path else f.encode_name
            queue.extend(_structs_in(f.type, child, f.encode_name))
    source = SourceCache.get()
    types = _Types(found)
    for cls, section in found.items():
        info = infos[cls]
        prefix = f"{section.path}." if section.path else ""
        if section.tag is not None:
            tag_key, tag_value = section.tag
            section.rows.append(
                Row(tag_key, prefix + tag_key, f"`{tag_value}`", "required", "picks this kind of provider")
            )
        for f in info.fields:
            section.rows.append(
                Row(
                    f.encode_name,
                    prefix + f.encode_name,
                    types.render(f.type, cls, f.name),
                    _default(f),
                    _prose(source.field_comment(cls, f.name)),
                )
            )
    return list(found.values())


HEADER = f"""\
# Configuration reference

<!-- Generated from gateway/settings.py by tools/config_reference.py: do not edit by hand. Regenerate with
     {COMMAND} -->

Generated from the config Structs in `gateway/settings.py` (the types, the defaults, and the comments and
docstrings beside them). Do not edit this page: regenerate it with `{COMMAND}`
(`tests/unit/test_docs.py` fails when it is out of date).

The file is YAML, read strictly: an unknown key, a wrong type, a value out of range or a target naming an unknown
provider is an error that names the key and its line. A string may hold `${{VAR}}` (an error if unset) and
`${{VAR:-default}}` (the default when unset or empty); `$$` is a literal `$`. Keep secrets in the environment.
Validate a file with `messages-gateway check-config PATH` ([Operations](operations.md#start-up-checks)).
How the keys work together, with examples: [Providers](providers.md), [Routing and resilience](routing.md),
[Governance](governance.md), [Observability](observability.md).

A path's `<name>`, `<alias>`, `<model>` or `<team>` is a key you choose; `[]` is an entry of a list. A type that
links to a section is a mapping of that section's keys.
"""


def _title(section: Section) -> str:
    if not section.path:
        return "Top level"
    return f"`{section.path}`" + (f" (`{section.tag[0]}: {section.tag[1]}`)" if section.tag else "")


def render() -> str:
    out = [HEADER]
    for section in sections():
        out.append(f'<a id="{section.anchor}"></a>\n')
        out.append(f"## {_title(section)}\n")
        doc = _prose(SourceCache.get().docstring(section.cls))
        lines = [f"{section.cls.__name__}." + (f" {doc}" if doc else "")]
        if section.also:
            lines.append("Also at " + ", ".join(f"`{p}`" for p in section.also) + ".")
        out.append(" ".join(lines) + "\n")
        out.append("| key | type | default | description |")
        out.append("|---|---|---|---|")
        for row in section.rows:
            out.append(f"| `{row.path}` | {row.type} | {row.default} | {row.description} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is out of date")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
