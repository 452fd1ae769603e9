#!/usr/bin/env bash
# Builds the Go baseline NRI plugin (main.go: a plugin that does nothing, on
# containerd's own Go stub) offline from Debian trixie packages: Go 1.24 and
# golang-github-containerd-nri-dev with its Go dependencies (packages.txt,
# the golang-*-dev closure of that package), unpacked with dpkg -x, never
# installed; built in GOPATH mode.  Go is a benchmark baseline only, never
# part of the product.
#   bench/go-null-plugin/build.sh [OUTPUT]   (default .cache/go-null-plugin/gonull)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
work="$top/.cache/go-null-plugin"
out="${1:-$work/gonull}"
root="$work/root"

if [ ! -x "$root/usr/lib/go-1.24/bin/go" ]; then
	mkdir -p "$work/debs"
	# shellcheck disable=SC2046  # one package name per line
	if ! (cd "$work/debs" && apt-get download -q -t trixie golang-1.24-go golang-1.24-src \
		$(cat "$here/packages.txt")) >"$work/download.log" 2>&1; then
		cat "$work/download.log" >&2
		exit 1
	fi
	rm -rf "$root.tmp" && mkdir -p "$root.tmp"
	for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$root.tmp"; done
	rm -rf "$root" && mv "$root.tmp" "$root"
fi

gopath="$work/gopath"
mkdir -p "$gopath/src/gonull"
cp "$here/main.go" "$gopath/src/gonull/main.go"
GOROOT="$root/usr/lib/go-1.24" GOPATH="$gopath:$root/usr/share/gocode" GO111MODULE=off \
	GOFLAGS='' GOTOOLCHAIN=local CGO_ENABLED=0 GOCACHE="$work/cache" \
	"$root/usr/lib/go-1.24/bin/go" build -o "$out" gonull
echo "$out"
