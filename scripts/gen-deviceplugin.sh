#!/usr/bin/env bash
# Regenerates the committed Python bindings of the kubelet device-plugin API
# (nri_gpushare/k8s/deviceplugin.proto) the way scripts/gen-protos.sh does the
# NRI ones.  Usage: scripts/gen-deviceplugin.sh [OUTPUT_DIR]
# (default nri_gpushare/k8s/generated; a unit test generates into a temporary
# directory and compares).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PROTO_DIR="$top/nri_gpushare/k8s" PROTOS="deviceplugin.proto" \
	exec "$top/scripts/gen-protos.sh" "${1:-$top/nri_gpushare/k8s/generated}"
