#!/usr/bin/env bash
# Regenerates the committed Python bindings of the kubelet device-plugin API
# (nri_gpushare/k8s/deviceplugin.proto) the way scripts/gen-protos.sh does the
# NRI ones.  Usage: scripts/gen-deviceplugin.sh [OUTPUT_DIR]
# (default nri_gpushare/k8s/generated, whose dra/ is scripts/gen-dra.sh's and
# is left as it is; a unit test generates into a temporary directory and
# compares).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out="${1:-$top/nri_gpushare/k8s/generated}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PROTO_DIR="$top/nri_gpushare/k8s" PROTOS="deviceplugin.proto" \
	"$top/scripts/gen-protos.sh" "$tmp/generated"
mkdir -p "$out"
rm -rf "$out/v1beta1"
cp -r "$tmp/generated/." "$out/"
