#!/usr/bin/env bash
# Regenerates the CRI v1 client used by the containerd test bed
# (tests/testbed/cri_generated/) from the api.proto in Debian trixie's
# golang-github-kubernetes-cri-api-dev, extracted by scripts/install-prereqs.sh.
# The gogoproto import and options are stripped first (protoc cannot resolve
# them and they only matter to Go).  Needs bookworm's protoc and the venv's
# betterproto 2.0.0b7 compiler plugin.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
proto=${CRI_PROTO:-$top/.cache/trixie/root/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto}
out="$top/tests/testbed/cri_generated"

if [ ! -f "$proto" ]; then
	echo "gen-cri: $proto missing; run scripts/install-prereqs.sh" >&2
	exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e '/^import "github.com\/gogo\/protobuf\/gogoproto\/gogo.proto";/d' \
    -e '/^option (gogoproto\./d' "$proto" >"$work/api.proto"
if grep -q gogoproto "$work/api.proto"; then
	echo "gen-cri: gogoproto still referenced after stripping" >&2
	exit 1
fi

mkdir "$work/out"
PATH="$top/.venv/bin:$PATH" protoc -I "$work" --python_betterproto_out="$work/out" "$work/api.proto"

rm -rf "$out"
mkdir -p "$out"
cp -r "$work/out/." "$out/"
cp "$work/api.proto" "$out/api.proto"
# Make every generated directory a regular package.
find "$out" -type d -exec sh -c '[ -f "$1/__init__.py" ] || : >"$1/__init__.py"' _ {} \;
echo "gen-cri: wrote $out"
