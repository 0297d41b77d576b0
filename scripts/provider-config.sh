#!/usr/bin/env bash
# Prints envoy/provider.yaml for one provider: `scripts/provider-config.sh HOST [PORT]`
# (PROVIDER_TEMPLATE names another file with the same placeholders, e.g.
# envoy/shard-gateway.yaml).
# The provider's certificate must chain to a CA of PROVIDER_CA (a PEM bundle),
# else of SSL_CERT_FILE, else of the system bundle OpenSSL uses; and it must be
# issued for HOST. `make run PROVIDER_HOST=…` and the e2e tests render it this way.
set -euo pipefail
cd "$(dirname "$0")/.."

host=${1:?usage: scripts/provider-config.sh HOST [PORT]}
port=${2:-443}
# Both go into YAML and a sed expression: a DNS name and a port, nothing else.
[[ "$host" =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] || { echo "not a host name: $host" >&2; exit 2; }
[[ "$port" =~ ^[0-9]{1,5}$ ]] || { echo "not a port: $port" >&2; exit 2; }

ca=${PROVIDER_CA:-${SSL_CERT_FILE:-}}
if [[ -z "$ca" ]] && command -v openssl > /dev/null; then
  dir=$(openssl version -d | sed -E 's/^OPENSSLDIR: "(.*)"$/\1/')
  ca="$dir/cert.pem"
fi
if [[ -z "$ca" || ! -r "$ca" ]]; then
  echo "no CA bundle to check the provider's certificate against: set PROVIDER_CA to a PEM file" >&2
  exit 1
fi
ca=$(readlink -f "$ca")
[[ "$ca" != *"|"* ]] || { echo "PROVIDER_CA must not contain '|': $ca" >&2; exit 2; }

# Comments keep the placeholders' names.
sed -e "/^ *#/!{s|PROVIDER_HOST|$host|g; s|PROVIDER_PORT|$port|g; s|PROVIDER_CA|$ca|g}" "${PROVIDER_TEMPLATE:-envoy/provider.yaml}"
