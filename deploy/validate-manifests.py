"""Validate rendered Kubernetes manifests (`helm template` of deploy/helm/messages-gateway) strictly.

    python deploy/validate-manifests.py RENDERED.yaml [RENDERED2.yaml ...] [--kubernetes-version 1.37.0]

Needs PyPI's kubernetes-validate (deploy/test-image.sh installs it into a venv of its own). The built-in
kinds are checked exactly as `kubernetes-validate --strict` checks them (unknown fields are errors); the
kinds of a CRD, which kubernetes-validate has no schema for, are checked against the schemas in
deploy/schemas/ (`<kind>-<group>-<version>.json`, written the same way). A kind with no schema at all is
an error, not a warning. Before the real files it validates broken copies (an unknown field in the
Deployment and, when one is rendered, in the ServiceMonitor and in its bearer authorization) and fails unless
each is rejected: strictness is checked, not assumed. Every file must hold a Deployment; at least one of them
a ServiceMonitor.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils
from referencing import Registry, Resource

SCHEMAS = Path(__file__).resolve().parent / "schemas"


def project_schema(doc: dict[str, Any]) -> Path | None:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])  # monitoring.coreos.com/v1
    path = SCHEMAS / f"{doc['kind'].lower()}-{group_version}.json"
    return path if path.exists() else None


def validate(doc: dict[str, Any], version: str) -> str:
    """'' when ``doc`` is valid, else what is wrong with it."""
    schema_path = project_schema(doc)
    if schema_path is None:
        try:
            utils.validate(doc, version, strict=True)
        except utils.ValidationError as exc:
            return f"{'.'.join(map(str, exc.path))}: {exc.message}"
        except utils.SchemaNotFoundError as exc:
            return f"{exc.message} (add one to deploy/schemas/)"
        return ""

    # ObjectMeta, LabelSelector... from the definitions kubernetes-validate itself uses for this version
    def key(v: str) -> tuple[int, ...]:
        return tuple(map(int, utils.major_minor(v).split(".")))

    (schema_version, *_) = [v for v in reversed(utils.all_versions()) if key(v) <= key(version)]
    definitions = utils.schema_contents(
        f"kubernetes-json-schema/v{schema_version}-local-strict/_definitions.json", version
    )
    schema = json.loads(schema_path.read_text())
    registry: Registry = Resource.from_contents(definitions) @ Registry()
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))
    return "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"


def broken_copies(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Copies of the first Deployment and ServiceMonitor with one unknown field each."""
    out = []
    for kind in ("Deployment", "ServiceMonitor"):
        originals = [d for d in docs if d["kind"] == kind]
        if originals:
            broken = copy.deepcopy(originals[0])
            broken["spec"]["notAField"] = True
            out.append((f"a {kind} with an unknown spec field", broken))
    for doc in docs:
        if doc["kind"] == "ServiceMonitor" and "authorization" in doc["spec"]["endpoints"][0]:
            broken = copy.deepcopy(doc)
            broken["spec"]["endpoints"][0]["authorization"]["credentials"]["nam"] = "typo"
            out.append(("a ServiceMonitor bearer with an unknown credentials field", broken))
            break
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rendered", nargs="+")
    parser.add_argument("--kubernetes-version", default=utils.latest_version(), help="major.minor (default: latest)")
    args = parser.parse_args()
    version = utils.major_minor(args.kubernetes_version.removeprefix("v"))
    failed = 0
    kinds: set[str] = set()
    for rendered in args.rendered:
        docs = [d for d in yaml.safe_load_all(Path(rendered).read_text()) if d]
        kinds |= {d["kind"] for d in docs}
        print(f"{rendered}:")
        if not any(d["kind"] == "Deployment" for d in docs):
            print(f"FAIL self-test: no Deployment in {rendered}")
            failed += 1
        for what, broken in broken_copies(docs):
            if not validate(broken, version):
                print(f"FAIL self-test: {what} passed: validation is not strict")
                failed += 1
        for doc in docs:
            problem = validate(doc, version)
            where = "deploy/schemas" if project_schema(doc) else f"kubernetes {version}, strict"
            print(f"{'FAIL' if problem else 'ok  '} {name(doc)} ({where}){': ' + problem if problem else ''}")
            failed += bool(problem)
    if "ServiceMonitor" not in kinds:
        print("FAIL self-test: no ServiceMonitor in any file: its schema went untested")
        failed += 1
    print(f"{len(args.rendered)} files, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
