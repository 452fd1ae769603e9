#!/usr/bin/env bash
# Regenerates the containerd gRPC client bindings (nri_gpushare/host/containerd/
# generated/) from containerd's own protos as shipped in Debian trixie's
# golang-github-containerd-containerd-dev (extracted into .cache/trixie by
# scripts/install-prereqs.sh).  Only what the client needs: the containers,
# namespaces, events and tasks services and the container/task event payloads
# (plus the types they import: tasks.proto's task/task.proto lands in package
# containerd.v1.types, hence generated/containerd/v1/).  Needs bookworm's
# protoc and the venv's betterproto 2.0.0b7 plugin (formatting with the pinned
# black and isort, so the output is byte-identical on regeneration).
# Usage: scripts/gen-containerd.sh [OUTPUT_DIR]
# (default nri_gpushare/host/containerd/generated; the unit test generates into a
# temporary directory and compares).  The google/protobuf/*.proto imports come
# from trixie's libprotobuf-dev, extracted alongside.  Override with
# $CONTAINERD_PROTO_ROOT, $PROTO_INCLUDE, $PROTOC and $BETTERPROTO_PLUGIN.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
src=${CONTAINERD_PROTO_ROOT:-$top/.cache/trixie/root/usr/share/gocode/src}
out="${1:-$top/nri_gpushare/host/containerd/generated}"
include=${PROTO_INCLUDE:-$top/.cache/trixie/root/usr/include}
protoc="${PROTOC:-/usr/bin/protoc}"
plugin="${BETTERPROTO_PLUGIN:-$top/.venv/bin/protoc-gen-python_betterproto}"

api=github.com/containerd/containerd/api
protos=(
	"$api/services/containers/v1/containers.proto"
	"$api/services/namespaces/v1/namespace.proto"
	"$api/services/events/v1/events.proto"
	"$api/services/tasks/v1/tasks.proto"
	"$api/events/container.proto"
	"$api/events/task.proto"
	"$api/types/fieldpath.proto"
	"$api/types/mount.proto"
	"$api/types/metrics.proto"
	"$api/types/descriptor.proto"
	"$api/types/task/task.proto"
)
for p in "${protos[@]/#/$src/}" "$include/google/protobuf/"{any,empty,timestamp}.proto; do
	if [ ! -f "$p" ]; then
		echo "gen-containerd: $p missing; run scripts/install-prereqs.sh" >&2
		exit 1
	fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/out"

# Relative proto names keep the "# sources:" header stable.
(cd "$src" && "$protoc" -I . -I "$include" --plugin=protoc-gen-python_betterproto="$plugin" \
	--python_betterproto_out="$tmp/out" "${protos[@]}" 2>"$tmp/log") || {
	cat "$tmp/log" >&2
	exit 1
}
# Make every generated directory a regular package.
find "$tmp/out" -type d -exec sh -c '[ -f "$1/__init__.py" ] || : >"$1/__init__.py"' _ {} \;

rm -rf "$out"
mkdir -p "$out"
cp -r "$tmp/out/." "$out/"
