#!/usr/bin/env python3
"""Checks the Istio manifests of examples/istio against Istio's API schema
(`make examples`).

Every document is parsed into the typed model of its kind from
cloudcoil-models-istio (generated from Istio's CRD schemas): a wrong type or
enum value fails, and so does a field the schema does not know, which
Kubernetes would silently prune. Then what the examples promise: a header
comment naming the Istio versions, a WasmPlugin pulled by digest from an
oci:// image with FAIL_OPEN, a selector and ports; EnvoyFilters scoped to a
namespace other than the root (or by a workload selector); remote code only
through an extension config (ECDS) with a sha256 and fail-open, discovered
with RBAC among its `type_urls` (the agent's fail-open stand-in); the mesh
config's `extraStatTags` naming the labels of envoy/envoy.yaml, whose rules are
the ones Istio's bootstrap writes for them; and, across files, a filter in `cache.mode: shard` whose
header a DestinationRule hashes on (`consistentHash.httpHeaderName`) for a
host a VirtualService sends the mesh's calls to; a Secret of provider keys
holding only Envoy SDS files of generic secrets, no other field, and, across
files, every SDS file a cluster patch names (with its directory watched, so a
rotation is taken up) one of a Secret's files holding the secret it names. The
Envoy fragments inside the patches are checked by Envoy itself (e2e `istio`,
e2e `istiod`).

    check_istio_examples.py [examples/istio]
"""

import json
import re
import sys
from pathlib import Path

import yaml
from cloudcoil.resources import parse

# Placeholders a user replaces (see the comments in the manifests), and
# values of the right shape to check the rest against.
PLACEHOLDERS = {
    "REGISTRY": "registry.example.com",
    "IMAGE_SHA256": "0123456789abcdef" * 4,
}
SHA256 = re.compile(r"^[0-9a-f]{64}$")
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
# What Istio's agent sends under a Wasm filter's name for a module it cannot
# pull (fail-open): an allow-all RBAC filter.
RBAC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
ROOT = Path(__file__).resolve().parent.parent
ENVOY_YAML = ROOT / "envoy" / "envoy.yaml"
# Istio's root namespace: an EnvoyFilter there without a selector patches
# every proxy of the mesh.
ROOT_NAMESPACE = "istio-system"


def demo_stats_tags():
    """The stats tag rules of envoy/envoy.yaml, the one source of them."""
    bootstrap = yaml.safe_load(ENVOY_YAML.read_text())
    return [
        {"tag_name": t["tag_name"], "regex": t["regex"]}
        for t in bootstrap["stats_config"]["stats_tags"]
    ]


def istio_stat_tag_rule(tag):
    """The rule Istio's bootstrap template (tools/packaging/common/
    envoy_bootstrap.json) writes for one name of `extraStatTags`."""
    return {"tag_name": tag, "regex": f"({tag}=\\.=(.*?);\\.;)"}


def unknown_fields(given, known, path=""):
    """Paths in `given` that did not survive the typed round trip `known`."""
    out = []
    if isinstance(given, dict):
        if not isinstance(known, dict):
            return [path or "."]
        for key, value in given.items():
            if key not in known:
                out.append(f"{path}.{key}" if path else key)
            else:
                out.extend(unknown_fields(value, known[key], f"{path}.{key}" if path else key))
    elif isinstance(given, list) and isinstance(known, list):
        for i, (a, b) in enumerate(zip(given, known)):
            out.extend(unknown_fields(a, b, f"{path}[{i}]"))
    return out


def check_schema(doc):
    resource = parse(doc)
    known = resource.model_dump(by_alias=True, exclude_unset=True, mode="json")
    extra = unknown_fields(doc, known)
    if extra:
        raise ValueError(f"fields the {doc['kind']} schema does not know: {', '.join(extra)}")


def check_bootstrap_override(doc):
    """A bootstrap override: JSON under `custom_bootstrap.json`, adding only
    bootstrap fields Istio's own bootstrap leaves unset."""
    custom = (doc.get("data") or {}).get("custom_bootstrap.json")
    if custom is None:
        return ["no data.custom_bootstrap.json"]
    bootstrap = json.loads(custom)
    unset_by_istio = {"memory_allocator_manager"}
    return [f"sets {key}, not a field known to be left unset by Istio's bootstrap"
            for key in bootstrap if key not in unset_by_istio]


# What the sidecar build of the module (an image tagged `-sidecar`) leaves
# out and refuses to be configured with (filter/core/src/build.rs, `PARTS`):
# a manifest loading it must name none of these.
NOT_IN_SIDECAR = ["cache", "routing", "limits", "guardrails", "credentials",
                  "tracing.otlp", "tracing.capture"]


def sidecar_misfits(image, config):
    """The parts `config` names that the sidecar build `image` would refuse."""
    if not image.endswith("-sidecar"):
        return []
    found = []
    for path in NOT_IN_SIDECAR:
        at = config
        for key in path.split("."):
            at = at.get(key) if isinstance(at, dict) else None
        if at is not None:
            found.append(f"names `{path}`, which the sidecar build ({image}) refuses: use the full image")
    return found


def check_wasmplugin(spec):
    problems = []
    if not spec.get("url", "").startswith("oci://"):
        problems.append("url is not an oci:// image")
    problems.extend(sidecar_misfits(spec.get("url", ""), spec.get("pluginConfig") or {}))
    if not SHA256.match(spec.get("sha256", "")):
        problems.append("no sha256 (the image manifest's digest)")
    if spec.get("failStrategy") != "FAIL_OPEN":
        problems.append("failStrategy is not FAIL_OPEN")
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    if not labels and not spec.get("targetRefs"):
        problems.append("no selector: it would load into every proxy of the namespace")
    matches = spec.get("match") or []
    if not matches or not all(m.get("ports") for m in matches):
        problems.append("match without ports")
    return problems


def plugin_configs(spec):
    """The filter configurations (JSON) of an EnvoyFilter's extension configs."""
    for patch in spec.get("configPatches") or []:
        if patch.get("applyTo") != "EXTENSION_CONFIG":
            continue
        typed = ((patch.get("patch") or {}).get("value") or {}).get("typed_config") or {}
        if typed.get("@type") == WASM_TYPE:
            config = typed.get("config") or {}
            yield json.loads((config.get("configuration") or {}).get("value", "{}"))


def check_sharding(docs):
    """Each shard-mode filter's header is hashed on by a DestinationRule whose
    host the mesh's calls are routed to."""
    headers = set()
    for doc in docs:
        if doc.get("kind") == "EnvoyFilter":
            for config in plugin_configs(doc.get("spec") or {}):
                cache = config.get("cache") or {}
                if cache.get("mode") == "shard":
                    headers.add(cache.get("shard_header", "x-llm-cache-key"))
    hashed = {}
    routed = set()
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") == "DestinationRule":
            lb = (spec.get("trafficPolicy") or {}).get("loadBalancer") or {}
            name = (lb.get("consistentHash") or {}).get("httpHeaderName")
            if name:
                hashed[name.lower()] = spec.get("host")
        if doc.get("kind") == "VirtualService":
            for route in spec.get("http") or []:
                if any("mesh" in (m.get("gateways") or []) for m in route.get("match") or []):
                    routed.update(d["destination"]["host"] for d in route.get("route") or [])
    problems = []
    for header in sorted(headers):
        host = hashed.get(header)
        if host is None:
            problems.append(f"no DestinationRule hashes on the shard header {header}")
        elif host not in routed:
            problems.append(f"the mesh's calls are not routed to {host}, which hashes on {header}")
    return problems


SDS_SECRET_TYPE = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"


def check_secret(doc):
    """A Secret of provider keys (not an Istio kind, so no schema of ours):
    each of its files an Envoy SDS file of generic secrets."""
    problems = []
    extra = set(doc) - {"apiVersion", "kind", "metadata", "type", "stringData"}
    if doc.get("apiVersion") != "v1" or extra:
        problems.append(f"a v1 Secret of metadata, type and stringData only (not {sorted(extra)})")
    for name, text in sds_files(doc).items():
        try:
            resources = yaml.safe_load(text)["resources"]
            if not resources or any(
                r["@type"] != SDS_SECRET_TYPE or "inline_string" not in r["generic_secret"]["secret"]
                for r in resources
            ):
                raise ValueError("a resource that is not a generic secret")
        except (TypeError, KeyError, ValueError, yaml.YAMLError) as e:
            problems.append(f"stringData.{name}: not an SDS file of generic secrets ({e})")
    return problems


def sds_files(doc):
    return (doc.get("stringData") or {}) if doc.get("kind") == "Secret" else {}


def sds_references(value):
    """Every (secret name, path, watched directory) an SDS file source names
    under `value`."""
    if isinstance(value, dict):
        source = (value.get("sds_config") or {}).get("path_config_source")
        if source:
            yield value.get("name"), source.get("path", ""), (source.get("watched_directory") or {}).get("path")
        for v in value.values():
            yield from sds_references(v)
    elif isinstance(value, list):
        for v in value:
            yield from sds_references(v)


def check_mounted_secrets(docs):
    """Each SDS file a cluster patch reads is a Secret's file (by its name;
    the mount's path is the Deployment's) holding the secret it names, in a
    directory Envoy watches."""
    files = {}
    for doc in docs:
        for name, text in sds_files(doc).items():
            try:
                files[name] = {r.get("name") for r in yaml.safe_load(text)["resources"]}
            except (TypeError, KeyError, yaml.YAMLError):
                files[name] = set()
    problems = []
    for doc in docs:
        if doc.get("kind") != "EnvoyFilter":
            continue
        for patch in (doc.get("spec") or {}).get("configPatches") or []:
            if patch.get("applyTo") != "CLUSTER":
                continue
            for name, path, watched in sds_references((patch.get("patch") or {}).get("value")):
                directory, _, file = path.rpartition("/")
                if watched != directory:
                    problems.append(f"{path}: its directory is not watched, a rotation would not be taken up")
                if name not in files.get(file, set()):
                    problems.append(f"{path}: no Secret's file {file} holds the secret {name}")
    return problems


def check_envoyfilter(spec, namespace):
    problems = []
    if namespace == ROOT_NAMESPACE and not (spec.get("workloadSelector") or {}).get("labels"):
        problems.append("no workloadSelector in the root namespace: it would patch every proxy of the mesh")
    for i, patch in enumerate(spec.get("configPatches") or []):
        value = (patch.get("patch") or {}).get("value") or {}
        text = json.dumps(value)
        if '"local"' in text and '"filename"' in text:
            problems.append(f"configPatches[{i}] loads a local file no pod has")
        if patch.get("applyTo") == "EXTENSION_CONFIG":
            typed = value.get("typed_config") or {}
            if typed.get("@type") != WASM_TYPE:
                continue
            config = typed.get("config") or {}
            remote = ((config.get("vm_config") or {}).get("code") or {}).get("remote") or {}
            uri = (remote.get("http_uri") or {}).get("uri", "")
            if not uri.startswith("oci://"):
                problems.append(f"configPatches[{i}]: code.remote is not an oci:// image")
            if not SHA256.match(remote.get("sha256", "")):
                problems.append(f"configPatches[{i}]: code.remote has no sha256")
            if not (config.get("fail_open") or config.get("failure_policy") == "FAIL_OPEN"):
                problems.append(f"configPatches[{i}]: the filter does not fail open")
            if config.get("allow_on_headers_stop_iteration") is not True:
                problems.append(f"configPatches[{i}]: no allow_on_headers_stop_iteration")
            plugin = json.loads((config.get("configuration") or {}).get("value", "{}"))
            problems.extend(f"configPatches[{i}]: {p}" for p in sidecar_misfits(uri, plugin))
        if patch.get("applyTo") == "HTTP_FILTER" and "typed_config" in value:
            if value["typed_config"].get("@type") == WASM_TYPE:
                problems.append(f"configPatches[{i}]: a Wasm filter inline, not by ECDS")
        urls = ((value.get("config_discovery") or {}).get("type_urls")) or []
        if patch.get("applyTo") == "HTTP_FILTER" and WASM_TYPE in urls and RBAC_TYPE not in urls:
            problems.append(
                f"configPatches[{i}]: type_urls lack RBAC, the stand-in Istio's agent sends for a module"
                " it cannot pull (Envoy would refuse it and answer 500)"
            )
    return problems


def check_mesh_config(doc):
    """An IstioOperator overlay whose `extraStatTags` are envoy/envoy.yaml's
    labels, in its order, with envoy/envoy.yaml's rules what Istio writes."""
    if doc.get("apiVersion") != "install.istio.io/v1alpha1":
        return ["an IstioOperator of install.istio.io/v1alpha1"]
    tags = (((doc.get("spec") or {}).get("meshConfig") or {}).get("defaultConfig") or {}).get("extraStatTags")
    demo = demo_stats_tags()
    if tags != [t["tag_name"] for t in demo]:
        return [f"extraStatTags {tags} are not envoy/envoy.yaml's labels"]
    if [istio_stat_tag_rule(t) for t in tags] != demo:
        return ["envoy/envoy.yaml's stats_tags are not the rules Istio writes for extraStatTags"]
    return []


def load(path):
    text = path.read_text()
    for name, value in PLACEHOLDERS.items():
        text = text.replace(name, value)
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def check_file(path):
    text = path.read_text()
    problems = []
    header = text.split("\napiVersion:", 1)[0]
    if not re.search(r"Istio \d+\.\d+", header):
        problems.append("the header comment names no Istio version")
    for name, value in PLACEHOLDERS.items():
        text = text.replace(name, value)
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        kind = doc.get("kind")
        where = f"{kind} {doc.get('metadata', {}).get('name')}"
        try:
            if kind == "ConfigMap":
                # Not an Istio kind: the bootstrap addition a
                # `sidecar.istio.io/bootstrapOverride` names (Envoy starts
                # with it in e2e istiod::istiod_sidecar_memory).
                found = check_bootstrap_override(doc)
            elif kind == "Secret":
                # Not an Istio kind: the provider keys a gateway mounts.
                found = check_secret(doc)
            elif kind == "IstioOperator":
                # No schema of its own among the CRD models: meshConfig is
                # checked field by field below.
                found = check_mesh_config(doc)
            else:
                check_schema(doc)
                spec = doc.get("spec") or {}
                namespace = (doc.get("metadata") or {}).get("namespace")
                found = {
                    "WasmPlugin": check_wasmplugin,
                    "EnvoyFilter": lambda spec: check_envoyfilter(spec, namespace),
                }.get(kind, lambda _: [])(spec)
        except Exception as e:  # a schema error names the field
            found = [str(e)]
        problems.extend(f"{where}: {p}" for p in found)
    return problems


def main(argv):
    directory = Path(argv[1] if len(argv) > 1 else "examples/istio")
    files = sorted(directory.glob("*.yaml"))
    if not files:
        print(f"no manifests in {directory}")
        return 1
    failed = 0
    for path in files:
        problems = check_file(path)
        for p in problems:
            print(f"{path}: {p}")
        failed += bool(problems)
    docs = [doc for path in files for doc in load(path)]
    across = check_sharding(docs) + check_mounted_secrets(docs)
    for p in across:
        print(f"{directory}: {p}")
    print(f"istio examples: {len(files) - failed} passed, {failed} failed")
    if across:
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
