#!/usr/bin/env python3
"""Derives the JSON schemas in this folder from prometheus-operator's CRDs.

    python3 derive.py PROMETHEUS_OPERATOR_CHECKOUT

reads example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml
of a prometheus-operator checkout (Apache-2.0) and writes servicemonitor.json and
prometheusrule.json beside this file: the v1 openAPIV3Schema of each CRD, with

- descriptions dropped (they are most of the bytes and none of the checking);
- `nullable: true` turned into a JSON-schema type that also allows null;
- Go's inline `(?i)` (case-insensitive; JSON schema's ECMA-262 patterns have no inline flags)
  spelled out as character classes (`abort` becomes `[aA][bB]...`);
- `additionalProperties: false` on every object that lists its properties and neither sets
  additionalProperties nor x-kubernetes-preserve-unknown-fields: the API server refuses unknown
  fields under `kubectl apply`'s default strict field validation, so a typo such as
  `bearerTokenFile` in the wrong place fails here as it would there;
- apiVersion and kind pinned to monitoring.coreos.com/v1 and the CRD's kind, and metadata
  required to carry a name.

Needs PyYAML (the deploy venv has it). The operator version the schemas come from is recorded in
each file's `$comment`; re-run this when moving to a newer operator.
"""

import json
import pathlib
import re
import sys

import yaml

CRDS = {
    "servicemonitor.json": "monitoring.coreos.com_servicemonitors.yaml",
    "prometheusrule.json": "monitoring.coreos.com_prometheusrules.yaml",
}


def ecma_pattern(pattern):
    """A Go regular expression with a leading-group `(?i)` flag as an ECMA-262 one without it."""
    if "(?i)" not in pattern:
        return pattern
    head, tail = pattern.split("(?i)", 1)
    spelled = re.sub(r"[A-Za-z]", lambda m: f"[{m.group().lower()}{m.group().upper()}]", tail)
    return head + spelled


def strict(node):
    """The schema `node` with descriptions dropped, nullable typed and unknown fields refused."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if key != "description"}
    if isinstance(out.get("pattern"), str):
        out["pattern"] = ecma_pattern(out["pattern"])
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def main(checkout):
    here = pathlib.Path(__file__).resolve().parent
    folder = pathlib.Path(checkout) / "example" / "prometheus-operator-crd"
    for target, source in CRDS.items():
        crd = yaml.safe_load((folder / source).read_text())
        operator = crd["metadata"]["annotations"]["operator.prometheus.io/version"]
        kind = crd["spec"]["names"]["kind"]
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schema = strict(version["schema"]["openAPIV3Schema"])
        schema["properties"]["apiVersion"] = {"const": "monitoring.coreos.com/v1"}
        schema["properties"]["kind"] = {"const": kind}
        schema["properties"]["metadata"] = {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        }
        schema["required"] = sorted(
            set(schema.get("required", [])) | {"apiVersion", "kind", "metadata", "spec"}
        )
        document = {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$comment": (
                f"{kind} v1 from prometheus-operator {operator} "
                f"(example/prometheus-operator-crd/{source}, Apache-2.0), derived by derive.py: "
                "descriptions dropped, unknown fields refused"
            ),
            **schema,
        }
        (here / target).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        print(f"{target}: {kind} from prometheus-operator {operator}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
