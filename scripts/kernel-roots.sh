#!/usr/bin/env bash
# Kernels of other Debian releases for the qemu guest (tests/guest/harness),
# each with a root of its own release to build modules in:
#
#   scripts/kernel-roots.sh [--refresh] RELEASE...     (trixie: 6.12, sid: 7.x)
#
# makes .cache/kernels/RELEASE/root: a minimal root of RELEASE (mmdebstrap)
# holding what building a module needs (the headers of linux-headers-amd64's
# kernel, the gcc it was built with, linux-kbuild, pahole) and, of the same
# ABI version, the kernel image and modules, unpacked rather than installed
# (an installed image's postinst would build an initramfs):
# root/boot/vmlinuz-VERSION, root/boot/config-VERSION and
# root/lib/modules/VERSION with its modules.dep.  A bookworm host cannot build
# for those kernels (6.12 needs gcc-14, 7.x gcc >= 15 and binutils >= 2.45,
# kbuild's helpers glibc >= 2.38): the harness builds with `chroot ROOT make`.
# Bookworm's own 6.1 comes from /boot (scripts/install-prereqs.sh).
#
# Idempotent: a finished root is kept until this script or the mirror changes,
# or --refresh is given.  The releases are made side by side; concurrent
# calls for one release wait for each other (flock).  Needs root and mmdebstrap.
set -euo pipefail

# mmdebstrap's customize hook (below) calls this script back with the new
# root: installs what the kernel's headers depend on, then unpacks the headers
# and the image (in newer releases split into linux-binary-, linux-modules-
# and linux-base-ABI) of one ABI version.  The headers are unpacked, not
# installed, as they depend on the image in some releases.
if [ "${1:-}" = --unpack-kernel ]; then
	root=$2
	say() { echo "kernel-roots: ${KERNEL_ROOTS_RELEASE:-}: $*"; }
	in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive "$@"; }
	# Package names in `apt-cache depends` lines "Depends: NAME" ending in $1
	# (fixed text, not a pattern), minus those starting with $2.
	depends() {
		awk -v end="$1" -v skip="${2:-}" '$1 ~ /^[|]?Depends:$/ {
			n = $2
			if (substr(n, length(n) - length(end) + 1) == end &&
			    (skip == "" || index(n, skip) != 1)) print n
		}'
	}
	headers=$(in_root apt-cache depends linux-headers-amd64 | depends -amd64 | grep -m1 '^linux-headers-') || {
		say "linux-headers-amd64 names no linux-headers-*-amd64" >&2
		exit 1
	}
	abi=${headers#linux-headers-}
	version=$(in_root apt-cache show --no-all-versions "$headers" | awk '$1 == "Version:" {print $2; exit}')
	deps=$(in_root apt-cache depends "$headers=$version" | depends '' linux-image-)
	say "kernel $abi ($version); installing what its headers need: ${deps//$'\n'/ }"
	# shellcheck disable=SC2086 # package names: one word each
	in_root apt-get install -qq -y --no-install-recommends $deps >/dev/null
	pkgs=("$headers=$version" "linux-image-$abi=$version")
	for p in $(in_root apt-cache depends "linux-image-$abi=$version" | depends "-$abi"); do
		pkgs+=("$p=$version")
	done
	say "unpacking ${pkgs[*]}"
	mkdir -p "$root/tmp/kernel-debs"
	in_root sh -c 'cd /tmp/kernel-debs && apt-get download -qq -o APT::Sandbox::User=root "$@"' \
		sh "${pkgs[@]}"
	for deb in "$root"/tmp/kernel-debs/*.deb; do
		in_root dpkg-deb -x "/tmp/kernel-debs/${deb##*/}" /
	done
	rm -rf "$root/tmp/kernel-debs"
	in_root depmod "$abi"
	# Newer releases keep the image and config under /usr/lib/modules/ABI only.
	for f in vmlinuz config; do
		[ -e "$root/boot/$f-$abi" ] || ln -s "../usr/lib/modules/$abi/$f" "$root/boot/$f-$abi"
	done
	if [ ! -f "$root/boot/vmlinuz-$abi" ] || [ ! -f "$root/lib/modules/$abi/modules.dep" ] ||
		[ ! -f "$root/lib/modules/$abi/build/Makefile" ]; then
		say "no image, modules.dep or headers for $abi in $root" >&2
		exit 1
	fi
	exit 0
fi

refresh=
if [ "${1:-}" = --refresh ]; then
	refresh=1
	shift
fi
if [ $# -eq 0 ]; then
	echo "usage: scripts/kernel-roots.sh [--refresh] RELEASE... (e.g. trixie sid)" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ] || ! command -v mmdebstrap >/dev/null; then
	echo "kernel-roots: needs root and mmdebstrap (scripts/install-prereqs.sh)" >&2
	exit 1
fi

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
base=$(cd "$(dirname "$0")/.." && pwd)/.cache/kernels
# What building a module needs besides what the headers depend on (the
# compiler the kernel was built with, linux-kbuild, pahole; installed by the
# hook).  kmod: depmod, for the unpacked modules.
packages=make,kmod

# The mirror this machine uses for RELEASE (install-prereqs.sh's pinned
# source), else bookworm's, else Debian's.
mirror_of() {
	local f
	for f in "/etc/apt/sources.list.d/gpushare-$1.sources" /etc/apt/sources.list.d/debian.sources; do
		if [ -f "$f" ]; then
			awk '/^URIs:/ {print $2; exit}' "$f"
			return
		fi
	done
	echo http://deb.debian.org/debian
}

# This machine's apt settings that reaching its mirror may need (a proxy; a
# mirror that is a dated snapshot, whose Release files have expired).
host_aptopts=()
valid_until='' http_proxy_opt=''
eval "$(apt-config shell valid_until Acquire::Check-Valid-Until http_proxy_opt Acquire::http::Proxy)"
[ -z "$valid_until" ] || host_aptopts+=("--aptopt=Acquire::Check-Valid-Until \"$valid_until\"")
[ -z "$http_proxy_opt" ] || host_aptopts+=("--aptopt=Acquire::http::Proxy \"$http_proxy_opt\"")

make_root() {
	local release=$1 dir=$base/$1 mirror key started
	mirror=$(mirror_of "$release")
	key=$( (printf '%s\n' "$release" "$mirror" "$packages" && cat "$self") | sha256sum | cut -c1-16)
	mkdir -p "$dir"
	exec {lock}>"$dir.lock"
	if ! flock -n "$lock"; then
		echo "kernel-roots: $release: waiting for another kernel-roots.sh"
		flock "$lock"
	fi
	if [ -z "$refresh" ] && [ "$(cat "$dir/stamp" 2>/dev/null)" = "$key" ]; then
		echo "kernel-roots: $release: ready: $(cd "$dir/root/boot" && echo vmlinuz-*) in $dir/root"
		exec {lock}>&-
		return
	fi
	started=$SECONDS
	echo "kernel-roots: $release: making $dir/root from $mirror ($packages)"
	rm -rf "$dir/root.new" "$dir/root.old"
	# shellcheck disable=SC2016 # the hook's words: mmdebstrap's sh expands them
	KERNEL_ROOTS_SELF=$self KERNEL_ROOTS_RELEASE=$release mmdebstrap --quiet --variant=apt --include="$packages" \
		--aptopt='APT::Install-Recommends "false"' --dpkgopt=force-unsafe-io \
		--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
		"${host_aptopts[@]}" \
		--customize-hook='"$KERNEL_ROOTS_SELF" --unpack-kernel "$1"' \
		"$release" "$dir/root.new" "deb $mirror $release main"
	# The old root stays usable until the new one is complete.
	rm -f "$dir/stamp"
	[ ! -e "$dir/root" ] || mv "$dir/root" "$dir/root.old"
	mv "$dir/root.new" "$dir/root"
	rm -rf "$dir/root.old"
	echo "$key" >"$dir/stamp"
	echo "kernel-roots: $release: made $(cd "$dir/root/boot" && echo vmlinuz-*)" \
		"in $((SECONDS - started)) s ($(du -sh "$dir/root" | cut -f1))"
	exec {lock}>&-
}

for release in "$@"; do
	case $release in
	*[!a-z]* | '')
		echo "kernel-roots: bad release name '$release'" >&2
		exit 2
		;;
	esac
done
# Side by side: each root mostly waits for the mirror or for dpkg.
declare -A release_of=()
for release in "$@"; do
	make_root "$release" &
	release_of[$!]=$release
done
failed=()
for pid in "${!release_of[@]}"; do
	wait "$pid" || failed+=("${release_of[$pid]}")
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "kernel-roots: FAILED: ${failed[*]}" >&2
	exit 1
fi
