#!/usr/bin/env bash
# The filter as an OCI image Istio's Wasm fetcher takes (`make image`, `make push`).
#
# Istio's agent reads the last layer of the image: with an OCI manifest it must be
# `application/vnd.oci.image.layer.v1.tar+gzip` and hold a file named
# `plugin.wasm` (the "compat" variant of the Wasm image format). umoci writes
# exactly that; skopeo moves the image between the local archive and a registry.
#
#   scripts/image.sh build <module.wasm> <archive.tar> <tag>
#       an OCI archive with one layer holding plugin.wasm; prints the module's and
#       the manifest's sha256 and writes the manifest's into <archive.tar>.digest
#   scripts/image.sh push <archive.tar> <registry/name:tag> [skopeo copy flags]
#       pushes it unchanged (same manifest digest, which WasmPlugin `sha256` names)
set -euo pipefail

die() { echo "image.sh: $*" >&2; exit 1; }
sha256() { sha256sum "$1" | cut -d' ' -f1; }

build() {
  local wasm=$1 archive=$2 tag=$3
  [[ -f "$wasm" ]] || die "no module at $wasm (make build)"
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/llm-filter-image.XXXXXX")
  trap 'rm -rf "$work"' RETURN
  local layout="$work/layout" bundle="$work/bundle"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --rootless --image "$layout:$tag" "$bundle" > /dev/null
  install -m 0644 "$wasm" "$bundle/rootfs/plugin.wasm"
  # Times from the commit, not the clock: the same commit gives the same digest.
  local created
  created=$(date -u -d "@$(git log -1 --format=%ct 2>/dev/null || echo 0)" +%Y-%m-%dT%H:%M:%SZ)
  touch -h -d "$created" "$bundle/rootfs/plugin.wasm" "$bundle/rootfs"
  umoci repack --image "$layout:$tag" --history.created "$created" --history.created_by "make image" \
    --history.comment "plugin.wasm" "$bundle"
  # The annotations registries and scanners show (OCI image spec, "Pre-Defined
  # Annotation Keys"), on the manifest and, as labels, on the image config.
  local version revision
  version=$tag
  revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  local -a notes=(
    "org.opencontainers.image.title=llm-filter"
    "org.opencontainers.image.description=proxy-wasm HTTP filter for OpenAI-compatible LLM calls (plugin.wasm, for Envoy and Istio WasmPlugin)"
    "org.opencontainers.image.version=$version"
    "org.opencontainers.image.revision=$revision"
    "org.opencontainers.image.created=$created"
    "org.opencontainers.image.licenses=Apache-2.0"
  )
  local -a flags=()
  for note in "${notes[@]}"; do
    flags+=(--manifest.annotation "$note" --config.label "$note")
  done
  umoci config --no-history --image "$layout:$tag" --author llm-filter --created "$created" "${flags[@]}"
  umoci gc --layout "$layout"
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive"
  # --preserve-digests: the archive holds the manifest umoci wrote, byte for byte.
  skopeo copy --quiet --preserve-digests "oci:$layout:$tag" "oci-archive:$archive:$tag"
  local digest
  digest=$(skopeo inspect --raw "oci-archive:$archive:$tag" | sha256sum | cut -d' ' -f1)
  echo "$digest" > "$archive.digest"
  echo "image:    $archive (tag $tag)"
  echo "module:   sha256 $(sha256 "$wasm") ($(stat -c %s "$wasm") bytes)"
  echo "manifest: sha256:$digest   <- WasmPlugin/ECDS \`sha256\` for an oci:// url"
}

push() {
  local archive=$1 image=$2
  shift 2
  [[ -f "$archive" ]] || die "no image at $archive (make image)"
  [[ -n "$image" ]] || die "name the image: make push IMAGE=<registry>/<name>:<tag>"
  skopeo copy --preserve-digests "$@" "oci-archive:$archive" "docker://$image"
  echo "pushed $image@sha256:$(cat "$archive.digest")"
}

case "${1:-}" in
  build) shift; [[ $# -eq 3 ]] || die "usage: build <module.wasm> <archive.tar> <tag>"; build "$@" ;;
  push) shift; [[ $# -ge 2 ]] || die "usage: push <archive.tar> <image> [skopeo flags]"; push "$@" ;;
  *) die "usage: image.sh build|push ..." ;;
esac
