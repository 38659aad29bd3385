"""Validate rendered Kubernetes manifests (`kubectl kustomize deploy/kubernetes`) strictly.

    python deploy/validate-manifests.py RENDERED.yaml [--kubernetes-version 1.37.0]

Needs PyPI's kubernetes-validate (deploy/test-image.sh installs it into a venv of its own). The built-in
kinds are checked exactly as `kubernetes-validate --strict` checks them (unknown fields are errors); the
kinds of a CRD, which kubernetes-validate has no schema for, are checked against the schemas in
deploy/schemas/ (`<kind>-<group>-<version>.json`, written the same way). A kind with no schema at all is
an error, not a warning. Before the real files it validates two broken copies (an unknown field in the
Deployment and in the ServiceMonitor) and fails unless both are rejected: strictness is checked, not
assumed.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rendered")
    parser.add_argument("--kubernetes-version", default=utils.latest_version(), help="major.minor (default: latest)")
    args = parser.parse_args()
    version = utils.major_minor(args.kubernetes_version.removeprefix("v"))
    docs = [d for d in yaml.safe_load_all(Path(args.rendered).read_text()) if d]
    failed = 0
    for kind in ("Deployment", "ServiceMonitor"):
        originals = [d for d in docs if d["kind"] == kind]
        if not originals:
            print(f"FAIL self-test: no {kind} in {args.rendered}")
            failed += 1
            continue
        broken = copy.deepcopy(originals[0])
        broken["spec"]["notAField"] = True
        if not validate(broken, version):
            print(f"FAIL self-test: a {kind} with an unknown spec field passed: validation is not strict")
            failed += 1
    for doc in docs:
        problem = validate(doc, version)
        where = "deploy/schemas" if project_schema(doc) else f"kubernetes {version}, strict"
        print(f"{'FAIL' if problem else 'ok  '} {name(doc)} ({where}){': ' + problem if problem else ''}")
        failed += bool(problem)
    print(f"{len(docs)} manifests, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
