#!/usr/bin/env bash
# Regenerates the committed Python bindings of the kubelet's DRA APIs
# (nri_gpushare/k8s/dra/*.proto: the DRA plugin v1 and v1beta1, plugin
# registration, device health v1alpha1 and v1) the way scripts/gen-protos.sh
# does the NRI ones.  Usage: scripts/gen-dra.sh [OUTPUT_DIR]
# (default nri_gpushare/k8s/generated/dra; a unit test generates into a
# temporary directory and compares).
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PROTO_DIR="$top/nri_gpushare/k8s/dra" \
	PROTOS="dra.proto dra_v1beta1.proto pluginregistration.proto dra_health.proto dra_health_v1.proto" \
	exec "$top/scripts/gen-protos.sh" "${1:-$top/nri_gpushare/k8s/generated/dra}"
