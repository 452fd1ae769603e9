#!/usr/bin/env bash
# Regenerates the committed Python bindings for nri_gpushare/nri/api/*.proto with
# Debian bookworm's protoc (3.21) and betterproto 2.0.0b7's protoc plugin from
# the project venv.  Usage: scripts/gen-protos.sh [OUTPUT_DIR]
# (default nri_gpushare/nri/api/generated; the schema test generates into a
# temporary directory and compares).  Override the tools with $PROTOC and
# $BETTERPROTO_PLUGIN; $PROTO_DIR and $PROTOS name other protos
# (scripts/gen-deviceplugin.sh).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
api="${PROTO_DIR:-$top/nri_gpushare/nri/api}"
read -r -a protos <<<"${PROTOS:-nri.proto ttrpc.proto}"
out="${1:-$api/generated}"
protoc="${PROTOC:-/usr/bin/protoc}"
plugin="${BETTERPROTO_PLUGIN:-$top/.venv/bin/protoc-gen-python_betterproto}"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Relative proto names keep the "# sources:" header stable.
(cd "$api" && "$protoc" -I . --plugin=protoc-gen-python_betterproto="$plugin" \
	--python_betterproto_out="$tmp" "${protos[@]}" 2>"$tmp/.log") || {
	cat "$tmp/.log" >&2
	exit 1
}
rm -f "$tmp/.log"
# protoc-gen-python_betterproto does not always write the top-level package file.
touch "$tmp/__init__.py"

rm -rf "$out"
mkdir -p "$out"
cp -r "$tmp"/. "$out"/
