#!/usr/bin/env bash
# Installs what the demo and the test suite need on a Debian bookworm machine:
# bookworm packages (runc, busybox-static, protoc, qemu, a kernel to boot under
# qemu and its headers) and, from Debian trixie, containerd 1.7.24 plus the
# NRI and CRI API protos, and Docker 26.1 (dockerd, the CLI, tini as
# docker-init) for the Docker test bed -- those are only downloaded and
# extracted into .cache/trixie, never installed over bookworm -- and, from
# Debian sid, the same for containerd 2.1.9, runc 1.3.6, Docker 28.5 and NRI
# 0.8.0's proto (extracted into .cache/sid; GPUSHARE_CONTAINERD=2 runs the
# test bed on them).  Idempotent; safe to re-run.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
cache="$top/.cache"
trixie="$cache/trixie"
mkdir -p "$cache" "$trixie"

apt_get() {
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -y -q "$@"
}

need_root() {
	if [ "$(id -u)" != 0 ]; then
		echo "install-prereqs: must run as root (installs Debian packages)" >&2
		exit 1
	fi
}

# --- Debian trixie and sid apt sources, pinned low so nothing is ever ---
# --- upgraded from them: their packages are only downloaded and extracted ---
pinned_suite() {
	[ -f "/etc/apt/sources.list.d/gpushare-$1.sources" ] && return
	need_root
	mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	mirror=${mirror:-http://deb.debian.org/debian}
	cat >"/etc/apt/sources.list.d/gpushare-$1.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $1
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	cat >"/etc/apt/preferences.d/gpushare-$1" <<PREF
Package: *
Pin: release n=$1
Pin-Priority: 100
PREF
	rm -f "$cache/apt-updated"
}
pinned_suite trixie
pinned_suite sid   # containerd 2.x, runc 1.3, Docker 28

if [ ! -f "$cache/apt-updated" ]; then
	need_root
	apt_get update
	touch "$cache/apt-updated"
fi

# --- bookworm packages ---
pkgs=(runc busybox-static protobuf-compiler qemu-system-x86 cpio kmod make gcc libc6-dev binutils
      linux-image-amd64 linux-headers-amd64 iproute2 shellcheck mmdebstrap systemd openssl
      patchelf)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	need_root
	apt_get install --no-install-recommends "${missing[@]}"
fi

# --- trixie packages, extracted only ---
# docker.io's usr/bin/docker-init is a link to tini's tini-static.  dockerd
# needs nothing else at run time that bookworm lacks (libc >= 2.34 is there;
# the test bed runs it without iptables, bridge or userland proxy).
trixie_pkgs=(containerd golang-github-containerd-nri-dev golang-github-kubernetes-cri-api-dev
            golang-github-containerd-containerd-dev libprotobuf-dev docker.io docker-cli tini)
# extract SUITE DIR PKG...: each package of SUITE downloaded into DIR and
# unpacked into DIR/root, once (DIR/.PKG.done).
extract() {
	local suite=$1 dir=$2 p
	shift 2
	mkdir -p "$dir"
	for p in "$@"; do
		if [ ! -f "$dir/.$p.done" ]; then
			(cd "$dir" && rm -f "${p}"_*.deb && apt-get download -q -t "$suite" "$p")
			dpkg-deb -x "$dir/${p}"_*.deb "$dir/root"
			touch "$dir/.$p.done"
		fi
	done
}
extract trixie "$trixie" "${trixie_pkgs[@]}"

# --- containerd 2.x, runc 1.3, Docker 28 from Debian sid, extracted only ---
# containerd, dockerd and docker need nothing newer than bookworm's libc
# (GLIBC_2.34).  runc 1.3.6 needs GLIBC_2.38: its extracted copy is pointed
# at sid's own loader and libraries (libc6, libseccomp2, extracted beside it)
# with patchelf.  A wrapper setting LD_LIBRARY_PATH would not do: runc
# re-executes itself (/proc/self/exe) as `runc init`, and a bookworm loader
# cannot run sid's libc.
sid="$cache/sid"
sid_pkgs=(containerd runc libc6 libseccomp2 docker.io docker-cli tini-static
          golang-github-containerd-nri-dev)
extract sid "$sid" "${sid_pkgs[@]}"
sid_runc="$sid/root/usr/sbin/runc"
sid_loader="$sid/root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
if [ "$(patchelf --print-interpreter "$sid_runc")" != "$sid_loader" ]; then
	patchelf --set-interpreter "$sid_loader" \
		--set-rpath "$sid/root/usr/lib/x86_64-linux-gnu" "$sid_runc"
fi
"$sid_runc" --version >/dev/null

# --- the kernel's checkpatch.pl, for `make -C kmod checkpatch` ---
sh "$top/kmod/fetch-checkpatch.sh"

# --- Python virtual environment ---
if [ ! -x "$top/.venv/bin/python" ]; then
	python3 -m venv "$top/.venv"
fi
stamp="$top/.venv/.installed-$(sha256sum "$top/pyproject.toml" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
	"$top/.venv/bin/pip" install -q -e "${top}[test]"
	touch "$stamp"
fi

# --- Synchronize's native scanner, next to its loader (package data) ---
make -s -C "$top/nri_gpushare/nri/wire/native"

# --- the compiled front (gpushare-runc and the CDI hooks), next to the ---
# --- Python programs it hands odd cases to: .venv/bin/gpushare-front ---
make -s -C "$top/front" PYBIN="$top/.venv/bin" venv
echo "install-prereqs: ok"
