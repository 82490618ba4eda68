#!/usr/bin/env python3
"""Renders and checks the Kubernetes manifests under deploy/kubernetes/, offline.

    check-kubernetes.py --hotsplit BIN [--kubectl KUBECTL] [--out DIR]
    check-kubernetes.py --write-rules      regenerate components/prometheus-rule from deploy/alerts.yaml

Run by scripts/check-deploy.sh with the deploy venv's python (PyYAML, kubernetes-validate; it
calls check-jsonschema and yamllint from the same venv). For every overlay, alone and with every
component, it:

1. renders it with `kubectl kustomize` (into DIR, target/kubernetes by default);
2. validates each object: built-in kinds with kubernetes-validate against the Kubernetes
   version pinned below (strict: unknown fields fail), the ServiceMonitor and PrometheusRule
   with check-jsonschema against the schemas committed in deploy/kubernetes/schemas/; any other
   kind fails;
3. lints the sources and the rendered output with yamllint (.yamllint);
4. runs `hotsplit config check` on the config the pod would get: the ConfigMap and Secret files
   written where the StatefulSet mounts them (under a scratch root; a Secret the overlay does not
   render, created out of band, gets a placeholder of the right shape), with the image's and the
   pod's environment, from the pod's working directory;
5. compares the manifests with the binary's own view (the drift test): each listener's port and
   address against the containerPorts, the probes' paths (against `hotsplit openapi`), ports and
   scheme against the admin listener and its TLS, terminationGracePeriodSeconds against
   preStop + server.drain_delay + server.shutdown_grace, the readiness period against the drain
   delay, the spool directory against a writable volume of the pod's own, the files the config
   names against the mounts, the pod's user against the Dockerfile's, the ServiceMonitor's port,
   path, scheme and job against the admin listener and deploy/alerts.yaml, and the
   PrometheusRule against deploy/alerts.yaml;
6. breaks a copy of one rendered overlay in each of those ways (a port, the grace period, a probe's
   path and scheme, the spool's volume, an unknown kind, unknown fields) and fails unless each
   is caught, so a check that stopped looking cannot pass quietly.

Exit status 0 when everything passes, 1 when a check fails, 2 for a usage error or a missing tool.
"""

import argparse
import base64
import ipaddress
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib

import yaml

# The Kubernetes version the built-in kinds are validated against (kubernetes-validate bundles
# its schemas; the version of kubernetes-validate itself is pinned in check-deploy.sh). 1.32:
# the oldest release still supported upstream when this was written that has everything the
# manifests use (the preStop sleep action needs 1.30).
KUBERNETES_VERSION = "1.32.0"

ROOT = pathlib.Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
SCHEMAS = KUBERNETES / "schemas"
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): SCHEMAS / "prometheusrule.json",
}
RULES = KUBERNETES / "components" / "prometheus-rule" / "prometheusrule.yaml"
ALERTS = ROOT / "deploy" / "alerts.yaml"
# What the drain needs beyond preStop, drain_delay and shutdown_grace: background tasks
# stopping, the spool's sync, the process's exit.
DRAIN_MARGIN_S = 5
# A tokens file line for a tokens Secret created out of band (the SHA-256 of "placeholder").
PLACEHOLDER_TOKENS = (
    "sha256:4097889236a2af26c293033feb964c4cf118c0224e0d063fec0a89e9d0569ef2 read # placeholder\n"
)

failures = []
# While the self-test runs, its expected failures are collected here, not reported.
expected = None


def fail(where, message):
    if expected is not None:
        expected.append(f"{where}: {message}")
        return
    failures.append(f"{where}: {message}")
    print(f"FAIL  {where}: {message}")


def ok(message):
    if expected is None:
        print(f"ok    {message}")


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def venv_tool(name):
    tool = pathlib.Path(sys.executable).parent / name
    if not tool.exists():
        sys.exit(
            f"check-kubernetes: {name} is not installed beside {sys.executable} (scripts/check-deploy.sh installs it)"
        )
    return str(tool)


# --- the PrometheusRule from deploy/alerts.yaml -------------------------------------------------


class RulesDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks and long ones folded, so lines stay short."""


def _string(dumper, text):
    if "\n" in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    if len(text) > 70:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", text)


RulesDumper.add_representer(str, _string)


def rules_document():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "hotsplit", "labels": {"app.kubernetes.io/name": "hotsplit"}},
        "spec": {"groups": groups},
    }
    header = (
        "# Generated from deploy/alerts.yaml by scripts/check-kubernetes.py --write-rules: edit\n"
        "# deploy/alerts.yaml (and its promtool tests), then regenerate. The check fails when\n"
        "# they differ.\n"
    )
    body = yaml.dump(rule, Dumper=RulesDumper, sort_keys=False, width=96, indent=2)
    return header + "---\n" + body


def write_rules():
    RULES.write_text(rules_document())
    print(f"wrote {RULES.relative_to(ROOT)}")


# --- rendering and validation -------------------------------------------------------------------


def render(kubectl, variant_dir, out):
    result = run([kubectl, "kustomize", str(variant_dir)])
    if result.returncode != 0:
        fail(out.stem, f"kubectl kustomize {variant_dir}: {result.stderr.strip()}")
        return None
    out.write_text(result.stdout)
    docs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    ok(f"{out.stem}: kubectl kustomize rendered {len(docs)} objects ({out.relative_to(ROOT)})")
    return docs


def validate(name, docs, custom):
    """Validates the built-in kinds of `docs` now; queues the CRD kinds' objects in `custom`
    (kind -> files) for one check-jsonschema run per kind ([`check_custom`])."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    builtin, bad = 0, 0
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        label = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if key in CUSTOM_KINDS:
            path = SCRATCH / f"{name}-{key[1]}-{len(custom.get(key, []))}.json"
            path.write_text(json.dumps(doc))
            custom.setdefault(key, []).append(str(path))
            continue
        builtin += 1
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except SchemaNotFoundError:
            bad += 1
            fail(
                name,
                f"{label}: unknown kind {key[0]} {key[1]} (no Kubernetes {KUBERNETES_VERSION} "
                "schema, no committed CRD schema)",
            )
        except ValidationError as err:
            bad += 1
            fail(name, f"{label}: {err.message} (at {'.'.join(str(p) for p in err.path)})")
    if not bad:
        ok(
            f"{name}: {builtin} objects valid for Kubernetes {KUBERNETES_VERSION} (kubernetes-validate, strict)"
        )


def check_custom(where, custom):
    """Runs check-jsonschema once per CRD kind on every queued object of that kind."""
    for key, files in sorted(custom.items()):
        schema = CUSTOM_KINDS[key]
        result = run([venv_tool("check-jsonschema"), "--schemafile", str(schema), *files])
        if result.returncode != 0:
            fail(
                where,
                f"{key[1]} against {schema.relative_to(ROOT)}:\n{result.stdout}{result.stderr}",
            )
        else:
            ok(
                f"{where}: {len(files)} {key[1]} valid against {schema.relative_to(ROOT)} (check-jsonschema)"
            )


def lint(paths):
    result = run(
        [venv_tool("yamllint"), "--strict", "-c", str(ROOT / ".yamllint"), *map(str, paths)]
    )
    if result.returncode != 0:
        fail("yamllint", "\n" + result.stdout + result.stderr)
    else:
        ok(f"yamllint: deploy/kubernetes and {len(paths) - 1} rendered files")


# --- the config the pod gets, through the binary ------------------------------------------------


def dockerfile():
    """The runtime image's ENV, WORKDIR, CMD and user id, from the Dockerfile's last stage."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stage = text.split("\nFROM ")[-1]
    env = {}
    for match in re.finditer(r"^ENV\s+(\S+)=(\S+)", stage, re.M):
        env[match.group(1)] = match.group(2)
    workdir = re.findall(r"^WORKDIR\s+(\S+)", stage, re.M)[-1]
    cmd = json.loads(re.findall(r"^CMD\s+(\[.*\])", stage, re.M)[-1])
    uid = int(re.search(r"useradd[^\n]*--uid (\d+)", stage).group(1))
    return {"env": env, "workdir": workdir, "cmd": cmd, "uid": uid}


def find(docs, kind, name):
    found = [d for d in docs if d.get("kind") == kind and d["metadata"].get("name") == name]
    return found[0] if found else None


def object_data(doc, key):
    if doc.get("kind") == "Secret":
        if key in doc.get("stringData", {}):
            return doc["stringData"][key].encode()
        if key in doc.get("data", {}):
            return base64.b64decode(doc["data"][key])
        return None
    if key in doc.get("data", {}):
        return doc["data"][key].encode()
    return None


def materialize(name, docs, pod, container, root):
    """Writes what the container's mounts hold under `root`; returns {mountPath: volume info}."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {c["metadata"]["name"] for c in pod.get("_claims", [])}
    mounts = {}
    for mount in container.get("volumeMounts", []):
        path = mount["mountPath"]
        target = root / path.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        info = {
            "readOnly": mount.get("readOnly", False),
            "claim": mount["name"] in claims,
            "source": None,
        }
        mounts[path] = info
        volume = volumes.get(mount["name"])
        if volume is None:
            if not info["claim"]:
                fail(
                    name, f"volumeMount {mount['name']} names no volume and no volumeClaimTemplate"
                )
            continue
        for kind, field, ref in (
            ("ConfigMap", "configMap", "name"),
            ("Secret", "secret", "secretName"),
        ):
            if field not in volume:
                continue
            source = volume[field]
            obj = find(docs, kind, source[ref])
            info["source"] = f"{kind} {source[ref]}"
            items = source.get("items")
            if obj is None and kind == "ConfigMap":
                fail(name, f"the ConfigMap {source[ref]} mounted at {path} is not rendered")
                continue
            if obj is None and items is None:
                fail(
                    name,
                    f"the Secret {source[ref]} (created out of band) is mounted at {path} without items: list its keys",
                )
                continue
            if items is None:
                keys = list(obj.get("data", {})) + list(obj.get("stringData", {}))
                items = [{"key": k, "path": k} for k in keys]
            for item in items:
                data = object_data(obj, item["key"]) if obj is not None else None
                if data is None and obj is not None:
                    fail(name, f"{kind} {source[ref]} has no key {item['key']} (mounted at {path})")
                    continue
                if data is None:
                    data = (
                        PLACEHOLDER_TOKENS if item["key"] == "tokens" else "placeholder\n"
                    ).encode()
                    info["source"] = f"{kind} {source[ref]} (created out of band: placeholders)"
                (target / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (target / item["path"]).write_bytes(data)
    return mounts


def effective_config(name, docs, hotsplit, image):
    """The StatefulSet, its container, and the config `hotsplit config check` prints for it."""
    sets = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "hotsplit"]
    if len(sets) != 1:
        fail(name, f"expected one StatefulSet hotsplit, found {len(sets)}")
        return None
    workload = sets[0]
    pod = dict(workload["spec"]["template"]["spec"])
    pod["_claims"] = workload["spec"].get("volumeClaimTemplates", [])
    containers = [c for c in pod["containers"] if c["name"] == "hotsplit"]
    if len(containers) != 1:
        fail(name, "expected one container named hotsplit")
        return None
    container = containers[0]
    root = pathlib.Path(tempfile.mkdtemp(prefix="pod-", dir=SCRATCH))
    mounts = materialize(name, docs, pod, container, root)
    # Longest first, so /etc/hotsplit/tls is rewritten before a mount on /etc/hotsplit would be.
    mount_paths = sorted(mounts, key=len, reverse=True)

    def rooted(text):
        for path in mount_paths:
            text = re.sub(
                rf'(^|[="\']){re.escape(path)}(?=/|"|\'|$)',
                lambda m: m.group(1) + str(root) + path,
                text,
                flags=re.M,
            )
        return text

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env.update(image["env"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), var["value"]
            )
        else:
            ref = var["valueFrom"]
            if "fieldRef" in ref:
                env[var["name"]] = "10.0.0.10"
            else:
                kind, key = (
                    ("Secret", ref["secretKeyRef"])
                    if "secretKeyRef" in ref
                    else ("ConfigMap", ref["configMapKeyRef"])
                )
                obj = find(docs, kind, key["name"])
                data = object_data(obj, key["key"]) if obj else b"placeholder"
                env[var["name"]] = (data or b"").decode()
    env = {k: rooted(v) for k, v in env.items()}
    config_path = env.get("HOTSPLIT_CONFIG")
    raw_file = None
    if config_path:
        file = pathlib.Path(config_path)
        if not file.exists():
            fail(name, f"HOTSPLIT_CONFIG {config_path[len(str(root)):]} is not in a mounted volume")
            return None
        raw_file = tomllib.loads(file.read_text())
        file.write_text(rooted(file.read_text()))
    workdir = container.get("workingDir", image["workdir"])
    cwd = root / workdir.lstrip("/")
    cwd.mkdir(parents=True, exist_ok=True)
    args = container.get("args", image["cmd"])
    if container.get("command") or not args or args[0] != "serve":
        fail(
            name,
            f"the container must run the image's entrypoint with serve, got command {container.get('command')} args {args}",
        )
        return None
    result = run([hotsplit, "config", "check", *args[1:]], env=env, cwd=cwd)
    if result.returncode != 0:
        fail(name, f"hotsplit config check: exit {result.returncode}: {result.stderr.strip()}")
        return None
    ok(
        f"{name}: hotsplit config check passes on the rendered config (mounts: "
        + ", ".join(
            f"{p} <- {m['source'] or ('claim' if m['claim'] else '?')}"
            for p, m in sorted(mounts.items())
        )
        + ")"
    )

    def unrooted(node):
        if isinstance(node, dict):
            return {k: unrooted(v) for k, v in node.items()}
        if isinstance(node, list):
            return [unrooted(v) for v in node]
        if isinstance(node, str) and node.startswith(str(root)):
            return node[len(str(root)) :]
        return node

    config = unrooted(tomllib.loads(result.stdout))
    return {
        "workload": workload,
        "pod": pod,
        "container": container,
        "config": config,
        "file": raw_file,
        "mounts": mounts,
        "root": root,
        "workdir": workdir,
    }


# --- the drift test -----------------------------------------------------------------------------


def seconds(duration):
    """A humantime duration as `hotsplit config check` prints it ("5s", "1m 30s", "250ms")."""
    units = {
        "ns": 1e-9,
        "us": 1e-6,
        "ms": 1e-3,
        "s": 1,
        "m": 60,
        "min": 60,
        "h": 3600,
        "d": 86400,
        "days": 86400,
        "day": 86400,
    }
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*([a-z]+)", duration):
        if unit not in units:
            raise ValueError(f"unknown unit in {duration!r}")
        total += int(number) * units[unit]
    return total


def address(text):
    host, _, port = text.rpartition(":")
    return ipaddress.ip_address(host.strip("[]")), int(port)


def drift(name, docs, pod_view, openapi_paths, image, alert_jobs):
    config, container, pod = pod_view["config"], pod_view["container"], pod_view["pod"]
    failed_before = len(failures)
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    listeners = {
        "http": config["server"]["listen"],
        "redis": config.get("resp", {}).get("listen"),
        "admin": config.get("admin", {}).get("listen"),
    }
    for port_name, listen in listeners.items():
        if listen is None:
            if port_name in ports:
                fail(
                    name,
                    f"containerPort {port_name} ({ports[port_name]}) is declared but nothing listens on it (its listen address is unset)",
                )
            continue
        ip, port = address(listen)
        if ports.get(port_name) != port:
            fail(
                name,
                f"containerPort {port_name} is {ports.get(port_name)}, the binary listens on {listen}",
            )
        if not ip.is_unspecified:
            fail(
                name,
                f"{port_name} listens on {listen}: the kubelet and the Service reach the pod's IP, listen on 0.0.0.0",
            )
    file_listen = (pod_view["file"] or {}).get("server", {}).get("listen")
    if file_listen and file_listen != config["server"]["listen"]:
        fail(
            name,
            f"hotsplit.toml says server.listen = {file_listen}, but the environment (HOTSPLIT_LISTEN) makes it {config['server']['listen']}: the file's value is ignored",
        )
    tls = bool(config["server"].get("tls_cert_file"))
    probe_listener = "admin" if listeners["admin"] else "http"
    probe_port = address(listeners[probe_listener])[1]

    def port_number(port):
        return ports.get(port) if isinstance(port, str) else port

    for probe, paths in (
        ("startupProbe", ("/healthz", "/readyz")),
        ("readinessProbe", ("/readyz",)),
        ("livenessProbe", ("/healthz",)),
    ):
        spec = container.get(probe, {}).get("httpGet")
        if spec is None:
            fail(name, f"{probe}: missing, or not an httpGet")
            continue
        if spec["path"] not in openapi_paths:
            fail(
                name,
                f"{probe}: path {spec['path']} is not a route of the binary (hotsplit openapi)",
            )
        elif spec["path"] not in paths:
            fail(name, f"{probe}: path {spec['path']}, expected {' or '.join(paths)}")
        if port_number(spec["port"]) != probe_port:
            fail(
                name,
                f"{probe}: port {spec['port']} ({port_number(spec['port'])}), but /healthz and /readyz are served on {probe_listener} {listeners[probe_listener]}",
            )
        scheme = spec.get("scheme", "HTTP")
        if scheme != ("HTTPS" if tls else "HTTP"):
            fail(
                name,
                f"{probe}: scheme {scheme}, but the listeners speak {'HTTPS (server.tls_cert_file)' if tls else 'plain HTTP'}",
            )
    drain_delay = seconds(config["server"]["drain_delay"])
    grace = seconds(config["server"]["shutdown_grace"])
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    if pre_stop is None:
        fail(name, "lifecycle.preStop: expected a sleep (the image has no shell)")
        pre_stop = 0
    termination = pod.get("terminationGracePeriodSeconds", 30)
    needed = pre_stop + drain_delay + grace + DRAIN_MARGIN_S
    if termination < needed:
        fail(
            name,
            f"terminationGracePeriodSeconds {termination} < preStop {pre_stop} s + server.drain_delay {drain_delay:g} s + server.shutdown_grace {grace:g} s + {DRAIN_MARGIN_S} s = {needed:g} s: the kubelet would SIGKILL a draining instance",
        )
    period = container.get("readinessProbe", {}).get("periodSeconds", 10)
    if drain_delay and period >= drain_delay:
        fail(
            name,
            f"readinessProbe.periodSeconds {period} is not below server.drain_delay {drain_delay:g} s",
        )
    # The spool: on a writable volume of the pod's own.
    if config.get("store", {}).get("redis"):
        spool = config["heal"]["spool_dir"]
        spool = spool if spool.startswith("/") else f"{pod_view['workdir'].rstrip('/')}/{spool}"
        holders = [
            p for p in pod_view["mounts"] if spool == p or spool.startswith(p.rstrip("/") + "/")
        ]
        holder = max(holders, key=len) if holders else None
        if (
            holder is None
            or not pod_view["mounts"][holder]["claim"]
            or pod_view["mounts"][holder]["readOnly"]
        ):
            fail(
                name,
                f"heal.spool_dir {spool} is not on a writable volumeClaimTemplate of the pod (the root filesystem is read-only, and a spool must outlive the pod)",
            )
    # Every file the config names is in a mounted volume (config check reads only some of them).
    for section, field in (
        ("server", "tls_cert_file"),
        ("server", "tls_key_file"),
        ("store", "tls_ca_file"),
        ("store", "tls_cert_file"),
        ("store", "tls_key_file"),
        ("store", "password_file"),
        ("auth", "tokens_file"),
    ):
        path = config.get(section, {}).get(field)
        if path and not (pod_view["root"] / path.lstrip("/")).is_file():
            fail(name, f"{section}.{field} {path} is not a file in any volume the pod mounts")
    # The pod's security settings.
    security = pod.get("securityContext", {})
    own = container.get("securityContext", {})
    expected = [
        (security.get("runAsNonRoot") is True, "securityContext.runAsNonRoot: true"),
        (
            security.get("runAsUser") == image["uid"],
            f"securityContext.runAsUser: {image['uid']} (the Dockerfile's user)",
        ),
        (
            security.get("seccompProfile", {}).get("type") == "RuntimeDefault",
            "seccompProfile RuntimeDefault",
        ),
        (own.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem: true"),
        (own.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false"),
        (own.get("capabilities", {}).get("drop") == ["ALL"], "capabilities.drop: [ALL]"),
        (
            pod.get("enableServiceLinks") is False,
            "enableServiceLinks: false (a Service named hotsplit would set HOTSPLIT_* variables)",
        ),
    ]
    for good, what in expected:
        if not good:
            fail(name, f"the pod needs {what}")
    # Services and the ServiceMonitor.
    services = [
        d
        for d in docs
        if d["kind"] == "Service"
        and d["spec"].get("selector", {}).get("app.kubernetes.io/name") == "hotsplit"
    ]
    for service in services:
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if port_number(target) is None or port_number(target) not in ports.values():
                fail(
                    name,
                    f"Service {service['metadata']['name']} port {port.get('name')}: targetPort {target} is no port of the container",
                )
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        chosen = [
            s
            for s in services
            if all(
                s["metadata"].get("labels", {}).get(k) == v
                for k, v in monitor["spec"]["selector"].get("matchLabels", {}).items()
            )
        ]
        if not chosen:
            fail(name, "the ServiceMonitor selects no hotsplit Service")
            continue
        job_label = monitor["spec"].get("jobLabel")
        jobs = {
            s["metadata"].get("labels", {}).get(job_label) if job_label else s["metadata"]["name"]
            for s in chosen
        }
        if alert_jobs and jobs != alert_jobs:
            fail(
                name,
                f"the ServiceMonitor gives job {sorted(jobs)}, deploy/alerts.yaml expects job {sorted(alert_jobs)}",
            )
        for endpoint in monitor["spec"]["endpoints"]:
            targets = {
                port_number(p.get("targetPort", p["port"]))
                for s in chosen
                for p in s["spec"]["ports"]
                if p.get("name") == endpoint.get("port")
            }
            if targets != {probe_port}:
                fail(
                    name,
                    f"the ServiceMonitor scrapes port {endpoint.get('port')} ({sorted(t for t in targets if t)}), /metrics is served on {probe_listener} {listeners[probe_listener]}",
                )
            if endpoint.get("path", "/metrics") not in openapi_paths:
                fail(
                    name,
                    f"the ServiceMonitor scrapes {endpoint.get('path')}, not a route of the binary",
                )
            if endpoint.get("scheme", "http") != ("https" if tls else "http"):
                fail(
                    name,
                    f"the ServiceMonitor scheme is {endpoint.get('scheme', 'http')}, the listeners speak {'https' if tls else 'http'}",
                )
    for rule in (d for d in docs if d["kind"] == "PrometheusRule"):
        if rule["spec"]["groups"] != yaml.safe_load(ALERTS.read_text())["groups"]:
            fail(
                name,
                "the PrometheusRule differs from deploy/alerts.yaml: "
                "run scripts/check-kubernetes.py --write-rules",
            )
    if len(failures) > failed_before:
        return
    ok(
        f"{name}: listeners {', '.join(f'{k} {v}' for k, v in listeners.items() if v)} match the containerPorts; "
        f"probes on {probe_listener} :{probe_port} {'HTTPS' if tls else 'HTTP'}; "
        f"terminationGracePeriodSeconds {termination} >= {pre_stop} + {drain_delay:g} + {grace:g} + {DRAIN_MARGIN_S}"
    )


def self_test(docs, hotsplit, openapi_paths, image, alert_jobs):
    """Breaks a copy of one rendered overlay in the ways the checks exist for, and fails unless
    each is caught: so a check that stopped looking fails here instead of passing quietly."""
    global expected

    def container(d):
        sts = [o for o in d if o["kind"] == "StatefulSet" and o["metadata"]["name"] == "hotsplit"]
        return sts[0]["spec"]["template"]["spec"]["containers"][0], sts[0]["spec"]["template"]

    def admin_port(d):
        for port in container(d)[0]["ports"]:
            if port["name"] == "admin":
                port["containerPort"] += 1

    def short_grace(d):
        container(d)[1]["spec"]["terminationGracePeriodSeconds"] = 10

    def wrong_path(d):
        container(d)[0]["readinessProbe"]["httpGet"]["path"] = "/ready"

    def plain_probe(d):
        container(d)[0]["livenessProbe"]["httpGet"]["scheme"] = "HTTP"

    def spool_on_root(d):
        for mount in container(d)[0]["volumeMounts"]:
            if mount["name"] == "spool":
                mount["mountPath"] = "/var/lib/elsewhere"

    def unknown_kind(d):
        d.append({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})

    def monitor_field(d):
        monitor = [o for o in d if o["kind"] == "ServiceMonitor"][0]
        monitor["spec"]["endpoints"][0]["bearerTokenSecretName"] = "x"

    def unknown_field(d):
        container(d)[0]["securityContext"]["readOnlyRootFilesytem"] = True

    # Each break, what the report must say, and which stage catches it (schemas or drift).
    cases = [
        (admin_port, "containerPort admin is", "drift"),
        (short_grace, "the kubelet would SIGKILL", "drift"),
        (wrong_path, "is not a route of the binary", "drift"),
        (plain_probe, "but the listeners speak HTTPS", "drift"),
        (spool_on_root, "is not on a writable volumeClaimTemplate", "drift"),
        (unknown_kind, "unknown kind example.com/v1 Widget", "schemas"),
        (unknown_field, "'readOnlyRootFilesytem' was unexpected", "schemas"),
        (monitor_field, "'bearerTokenSecretName' was unexpected", "crd"),
    ]
    for breaks, message, stage in cases:
        broken = json.loads(json.dumps(docs))
        breaks(broken)
        expected = []
        try:
            if stage in ("schemas", "crd"):
                custom = {}
                validate("self-test", broken, custom)
                if stage == "crd":
                    check_custom("self-test", custom)
            else:
                view = effective_config("self-test", broken, hotsplit, image)
                if view is not None:
                    drift("self-test", broken, view, openapi_paths, image, alert_jobs)
        finally:
            caught, expected = expected, None
        if any(message in line for line in caught):
            ok(f"self-test: {breaks.__name__} is caught ({message!r})")
        else:
            fail(
                "self-test",
                f"{breaks.__name__} was not caught (expected {message!r}, got {caught})",
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hotsplit", help="the hotsplit binary")
    parser.add_argument("--kubectl", default="kubectl")
    parser.add_argument("--out", default=str(ROOT / "target" / "kubernetes"))
    parser.add_argument("--write-rules", action="store_true")
    args = parser.parse_args()
    if args.write_rules:
        write_rules()
        return 0
    if not args.hotsplit:
        parser.error("--hotsplit BIN is required")
    args.hotsplit = str(pathlib.Path(args.hotsplit).resolve())
    if not os.access(args.hotsplit, os.X_OK):
        print(
            f"check-kubernetes: {args.hotsplit} is not an executable hotsplit binary",
            file=sys.stderr,
        )
        return 2
    kubectl = shutil.which(args.kubectl)
    if kubectl is None:
        print(
            f"check-kubernetes: kubectl not found ({args.kubectl}): it renders the manifests (kubectl kustomize)",
            file=sys.stderr,
        )
        return 2
    out = pathlib.Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    global SCRATCH
    SCRATCH = out / "scratch"
    SCRATCH.mkdir()

    if RULES.read_text() != rules_document():
        fail(
            "prometheus-rule",
            f"{RULES.relative_to(ROOT)} is not what deploy/alerts.yaml generates: run scripts/check-kubernetes.py --write-rules",
        )
    openapi = run([args.hotsplit, "openapi"])
    if openapi.returncode != 0:
        print(
            f"check-kubernetes: {args.hotsplit} openapi failed: {openapi.stderr}", file=sys.stderr
        )
        return 2
    openapi_paths = set(json.loads(openapi.stdout)["paths"])
    image = dockerfile()
    alert_jobs = set(re.findall(r'job="([^"]+)"', ALERTS.read_text()))

    overlays = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
    components = sorted(p for p in (KUBERNETES / "components").iterdir() if p.is_dir())
    rendered = []
    custom = {}
    first = None
    for overlay in overlays:
        variants = [(overlay.name, overlay)]
        # The overlay with every component, as a user enables them: a kustomization beside it.
        combined = out / "variants" / f"{overlay.name}+components"
        combined.mkdir(parents=True)
        (combined / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(overlay, combined)],
                    "components": [os.path.relpath(c, combined) for c in components],
                }
            )
        )
        variants.append((f"{overlay.name}+components", combined))
        for name, directory in variants:
            target = out / f"{name}.yaml"
            docs = render(kubectl, directory, target)
            if docs is None:
                continue
            rendered.append(target)
            if name == f"{overlays[0].name}+components":
                first = docs
            validate(name, docs, custom)
            pod_view = effective_config(name, docs, args.hotsplit, image)
            if pod_view is not None:
                drift(name, docs, pod_view, openapi_paths, image, alert_jobs)
    check_custom("crd-schemas", custom)
    lint([KUBERNETES, *rendered])
    if first is not None:
        self_test(first, args.hotsplit, openapi_paths, image, alert_jobs)
    if failures:
        print(f"check-kubernetes: {len(failures)} failed", file=sys.stderr)
        return 1
    return 0


SCRATCH = None

if __name__ == "__main__":
    sys.exit(main())
