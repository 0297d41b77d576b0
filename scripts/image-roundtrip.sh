#!/usr/bin/env bash
# `make image-test`: the image as Istio's agent sees it. Starts a private
# registry (Debian's docker-registry) on a free loopback port with its own
# config and storage, pushes the archive `make image` built with `make push`'s
# own script, pulls it back and extracts the module the way Istio's fetcher
# does (manifest, last layer, gzip'd tar, the file named plugin.wasm), then
# checks the bytes are the module's and the digest is the one the build printed.
set -euo pipefail
cd "$(dirname "$0")/.."

wasm=$1 archive=$2 tag=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/llm-filter-image-test.XXXXXX")
registry_pid=
cleanup() {
  if [[ -n "$registry_pid" ]]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "image-test: FAILED: $*" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/storage"
cat > "$work/config.yml" <<EOF
version: 0.1
log: { level: warn }
storage:
  filesystem: { rootdirectory: $work/storage }
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$work/config.yml" > "$work/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/v2/" > /dev/null 2>&1 && break
  kill -0 "$registry_pid" 2>/dev/null || { cat "$work/registry.log"; fail "the registry exited"; }
  sleep 0.1
done
curl -fs "http://127.0.0.1:$port/v2/" > /dev/null || fail "the registry did not answer on 127.0.0.1:$port"

image="127.0.0.1:$port/llm-filter:$tag"
scripts/image.sh push "$archive" "$image" --quiet --dest-tls-verify=false

# What the registry serves, fetched the way Istio's agent does.
skopeo copy --quiet --src-tls-verify=false "docker://$image" "dir:$work/pulled"
manifest="$work/pulled/manifest.json"
digest=$(sha256sum "$manifest" | cut -d' ' -f1)
[[ "$digest" == "$(cat "$archive.digest")" ]] ||
  fail "the registry serves manifest sha256:$digest, the build printed sha256:$(cat "$archive.digest")"
media=$(jq -r '.layers[-1].mediaType' "$manifest")
[[ "$media" == application/vnd.oci.image.layer.v1.tar+gzip ]] || fail "last layer is $media"
layer=$(jq -r '.layers[-1].digest' "$manifest")
mkdir -p "$work/layer"
tar -xzf "$work/pulled/${layer#sha256:}" -C "$work/layer"
found=$(find "$work/layer" -name plugin.wasm -type f)
[[ -n "$found" ]] || fail "no plugin.wasm in the last layer"
want=$(sha256sum "$wasm" | cut -d' ' -f1)
got=$(sha256sum "$found" | cut -d' ' -f1)
[[ "$got" == "$want" ]] || fail "plugin.wasm has sha256 $got, the module $want"
for key in title version revision created licenses; do
  jq -e --arg k "org.opencontainers.image.$key" '.annotations[$k] // empty' "$manifest" > /dev/null ||
    fail "manifest lacks annotation org.opencontainers.image.$key"
done
echo "image-test: pushed to a local registry and pulled back: plugin.wasm sha256 $got, manifest sha256:$digest"
