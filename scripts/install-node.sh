#!/bin/sh
# Installs nri-gpushare on a Debian 12 or 13 / Ubuntu 24.04 node, as root,
# from this source tree (docs/install.md says what goes where and why):
#
#   sh scripts/install-node.sh [--kernel KVER] [--no-kmod] [--no-apt]
#   sh scripts/install-node.sh --uninstall [--purge] [--kmod-root DIR]
#   sh scripts/install-node.sh --prune      # interposer versions no container uses
#
# Install (re-run = upgrade): Debian packages (apt), the daemon in its own
# virtualenv /opt/nri-gpushare/venv with its commands linked into
# /usr/local/bin (gpushare-runc: the compiled front, also the CDI hooks), /etc/nri-gpushare/gpushare.yaml when absent (never
# overwritten), the systemd unit, the CUDA interposer under a versioned path
# with an atomically swapped symlink, and gpushare.ko through DKMS (rebuilt
# for every new kernel) with /etc/modules-load.d/gpushare.conf.
#
# --kernel KVER (or GPUSHARE_KERNEL): the kernel DKMS builds for now (default:
# the running one; another one for an install into a root for another kernel).
# --no-kmod: no kernel module (no DKMS, no headers, no modules-load.d entry).
# --no-apt: install no Debian packages (they must be there already).
#
# Uninstall: `nri-gpushare uninstall` first, which unloads the module and
# refuses while containers are registered (then nothing is removed); then the
# unit, the DKMS module, the modules-load.d entry, the links and the venv.
# /etc/nri-gpushare, the state directory and interposer versions still
# mounted by a container stay; --purge removes the first two and every unused
# interposer version as well.
#
# Without a running systemd (a chroot, a container) every systemctl step is
# skipped with a note.  Never loads a kernel module itself.
set -eu
# What it makes is root's and read-only to others, whatever umask it is run
# with (a world-writable venv or interposer directory would let any local
# user change the daemon's code or what every GPU container loads).
umask 022

PREFIX=/opt/nri-gpushare
VENV=$PREFIX/venv
ETC=/etc/nri-gpushare
CONFIG=$ETC/gpushare.yaml
UNIT_DIR=/usr/local/lib/systemd/system
UNIT=$UNIT_DIR/nri-gpushare.service
MODULES_LOAD=/etc/modules-load.d/gpushare.conf
DOC=/usr/local/share/doc/nri-gpushare
LIBDIR=/usr/lib/nri-gpushare
LIBLINK=$LIBDIR/libgpushare.so
STATE_DIR=/var/lib/nri-gpushare
COMMANDS="nri-gpushare gpushare-runc gpushare-smi"

src=$(cd "$(dirname "$0")/.." && pwd)

say() { echo "install-node: $*"; }
die() {
	echo "install-node: $*" >&2
	exit 1
}

usage() {
	sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//'
}

action=install
kernel=${GPUSHARE_KERNEL:-}
with_kmod=1
with_apt=1
purge=0
kmod_root=/proc/gpushare
while [ $# -gt 0 ]; do
	case $1 in
	--uninstall) action=uninstall ;;
	--prune) action=prune ;;
	--purge) purge=1 ;;
	--kernel)
		[ $# -ge 2 ] || die "--kernel needs a kernel release (e.g. $(uname -r))"
		kernel=$2
		shift
		;;
	--kernel=*) kernel=${1#--kernel=} ;;
	--kmod-root)
		[ $# -ge 2 ] || die "--kmod-root needs a directory"
		kmod_root=$2
		shift
		;;
	--no-kmod) with_kmod=0 ;;
	--no-apt) with_apt=0 ;;
	-h | --help)
		usage
		exit 0
		;;
	*) die "unknown argument '$1' (see --help)" ;;
	esac
	shift
done
kernel=${kernel:-$(uname -r)}
case $kernel in
'' | *[!A-Za-z0-9._+~-]*) die "--kernel '$kernel': not a kernel release (e.g. $(uname -r))" ;;
esac
build=""
# A failed step leaves no build directory behind in /tmp.
trap 'rm -rf ${build:+"$build"}' EXIT

[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and system files)"

# The project's version (pyproject.toml): the DKMS version, the interposer's
# directory.
version=$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$src/pyproject.toml" | head -n 1)
case $version in
'' | *[!A-Za-z0-9.+~-]*) die "cannot read the version from $src/pyproject.toml" ;;
esac

have_systemd() { [ -d /run/systemd/system ]; }

systemctl_or_note() {
	if have_systemd; then
		systemctl "$@"
	else
		say "systemd is not running here: skipped 'systemctl $*'"
	fi
}

# ---------------------------------------------------------------- install

apt_install() {
	missing=""
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
			missing="$missing $p"
	done
	[ -n "$missing" ] || return 0
	say "installing Debian packages:$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 -y -q update
	# shellcheck disable=SC2086 # one word per package
	apt-get -o DPkg::Lock::Timeout=600 -y -q install --no-install-recommends $missing
}

install_packages() {
	pkgs="python3 python3-venv gcc make libc6-dev"
	if [ "$with_kmod" = 1 ]; then
		# dkms installs its kernel hook (/etc/kernel/postinst.d/dkms): every
		# new kernel gets the module built, given its headers.  The headers
		# pull the compiler their kernel was built with (Debian 13's 6.12:
		# gcc-14, and pahole through linux-kbuild).
		pkgs="$pkgs dkms kmod linux-headers-$kernel"
	fi
	if [ "$with_apt" = 1 ]; then
		# shellcheck disable=SC2086
		apt_install $pkgs
	fi
	for cmd in python3 cc make; do
		command -v "$cmd" >/dev/null || die "$cmd is missing (install: $pkgs)"
	done
	if [ "$with_kmod" = 1 ]; then
		command -v dkms >/dev/null || die "dkms is missing (install: $pkgs)"
		[ -e "/lib/modules/$kernel/build" ] ||
			die "no headers for kernel $kernel (/lib/modules/$kernel/build): install linux-headers-$kernel, or pass --kernel KVER, or --no-kmod"
	fi
}

install_daemon() {
	if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
		# Missing, or broken by a Python upgrade: made anew.
		rm -rf "$VENV"
		mkdir -p "$PREFIX"
		python3 -m venv "$VENV"
	fi
	say "installing the daemon into $VENV"
	# Built from a copy: the source tree is left as it was (no build/ there).
	build=$(mktemp -d)
	tar -C "$src" -cf - --exclude=./.git --exclude=./.venv --exclude=./.cache \
		--exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
		pyproject.toml README.md LICENSE nri_gpushare | tar -C "$build" -xf -
	# Synchronize's native scanner, built in the copy (-B: never a .so the source tree held).
	make -s -B -C "$build/nri_gpushare/nri/wire/native" libnriscan.so >/dev/null
	"$VENV/bin/pip" install -q --upgrade "$build"
	rm -rf "$build"
	# The compiled gpushare-runc and CDI hooks (front/), in the venv next to
	# the Python programs it hands odd cases to: gpushare-runc is the front.
	build=$(mktemp -d)
	make -s -C "$src/front" BUILD="$build" PYBIN="$VENV/bin" "$build/gpushare-front" >/dev/null
	install -m 0755 "$build/gpushare-front" "$VENV/bin/.gpushare-front.tmp"
	mv "$VENV/bin/.gpushare-front.tmp" "$VENV/bin/gpushare-front"
	rm -rf "$build"
	for cmd in $COMMANDS; do
		target=$VENV/bin/$cmd
		[ "$cmd" = gpushare-runc ] && target=$VENV/bin/gpushare-front
		[ -x "$target" ] || die "$target was not installed"
		ln -sfn "$target" "/usr/local/bin/$cmd"
	done
}

install_config() {
	mkdir -p "$ETC"
	if [ -e "$CONFIG" ]; then
		say "keeping the existing $CONFIG (the shipped one is $src/config/gpushare.yaml)"
		return 0
	fi
	# The shipped config with two changes: no static inventory (its example
	# GPU would be offered on a node where NVML finds none: list the GPUs by
	# hand only for a node without a driver), and kmod_load on when the
	# module is installed.
	tmp=$CONFIG.tmp.$$
	sed -e 's/^inventory:$/inventory: []   # GPUs come from NVML; list them here only without a driver, e.g.:/' \
		-e 's/^  - {index: /#  - {index: /' "$src/config/gpushare.yaml" >"$tmp"
	if [ "$with_kmod" = 1 ]; then
		sed -i 's/^kmod_load: false$/kmod_load: true/' "$tmp"
	fi
	grep -q '^inventory: \[\]' "$tmp" || die "could not empty the inventory of the shipped config"
	chmod 0644 "$tmp"
	sync "$tmp" 2>/dev/null || sync
	mv "$tmp" "$CONFIG"
	say "wrote $CONFIG"
}

install_unit() {
	mkdir -p "$UNIT_DIR"
	tmp=$UNIT.tmp.$$
	cp "$src/systemd/nri-gpushare.service" "$tmp"
	chmod 0644 "$tmp"
	mv "$tmp" "$UNIT"
	# The unit's Documentation= names this copy.
	mkdir -p "$DOC"
	cp "$src/docs/install.md" "$DOC/install.md"
	say "installed $UNIT"
}

# The library lives at $LIBDIR/<version>/libgpushare.so, a new file that is
# never written over (a container keeps using the one it mounted); the
# configured path $LIBLINK is a symlink, swapped atomically (rename) to the
# new version.  The daemon mounts the version the link names at create time.
install_interposer() {
	build=$(mktemp -d)
	say "building the CUDA interposer"
	make -s -C "$src/libgpushare" BUILD="$build" "$build/libgpushare.so" >/dev/null
	mkdir -p "$LIBDIR"
	dir=$version
	if [ -e "$LIBDIR/$dir/libgpushare.so" ] && ! cmp -s "$build/libgpushare.so" "$LIBDIR/$dir/libgpushare.so"; then
		# Same version, other bytes (rebuilt from changed sources): a new
		# directory, never the old file rewritten.
		dir=$version-$(sha256sum "$build/libgpushare.so" | cut -c1-12)
	fi
	if [ ! -e "$LIBDIR/$dir/libgpushare.so" ]; then
		mkdir -p "$LIBDIR/$dir"
		cp "$build/libgpushare.so" "$LIBDIR/$dir/.libgpushare.so.tmp"
		chmod 0644 "$LIBDIR/$dir/.libgpushare.so.tmp"
		sync "$LIBDIR/$dir/.libgpushare.so.tmp" 2>/dev/null || sync
		mv "$LIBDIR/$dir/.libgpushare.so.tmp" "$LIBDIR/$dir/libgpushare.so"
	fi
	rm -rf "$build"
	ln -sfn "$dir/libgpushare.so" "$LIBDIR/.libgpushare.so.new"
	mv -T "$LIBDIR/.libgpushare.so.new" "$LIBLINK"
	say "interposer: $LIBLINK -> $dir/libgpushare.so"
	if [ -e /etc/cdi/gpushare.io-gpu.json ] || [ -e /var/run/cdi/gpushare.io-gpu.json ]; then
		say "a CDI spec of gpushare.io exists: run 'nri-gpushare cdi generate' again so that CDI containers get this version"
	fi
}

dkms_versions() {
	# "gpushare/0.1.0, 6.1.0-56-amd64, x86_64: installed" (dkms 3) or
	# "gpushare, 0.1.0, ...: added" (dkms 2): the versions DKMS knows.
	dkms status gpushare 2>/dev/null |
		sed -n -e 's|^gpushare/\([^,:]*\)[,:].*|\1|p' -e 's|^gpushare, \([^,:]*\)[,:].*|\1|p' | sort -u
}

install_kmod() {
	usr_src=/usr/src/gpushare-$version
	build=$(mktemp -d)
	(cd "$src/kmod" && tar -cf - Kbuild Makefile COPYING ./*.c ./*.h include) | tar -C "$build" -xf -
	sed "s/^PACKAGE_VERSION=.*/PACKAGE_VERSION=\"$version\"/" "$src/kmod/dkms.conf" >"$build/dkms.conf"
	if dkms_versions | grep -qxF "$version"; then
		if diff -r -q "$build" "$usr_src" >/dev/null 2>&1 &&
			dkms status -m gpushare -v "$version" -k "$kernel" 2>/dev/null | grep -q ': installed'; then
			# A re-run with the same sources: the module DKMS built stays
			# (removing it first would leave the node none if a build failed).
			rm -rf "$build"
			say "DKMS: gpushare $version is built and installed for $kernel from these sources already"
			modules_load
			return 0
		fi
		# This version from other sources: DKMS adds a version only once.
		dkms remove -m gpushare -v "$version" --all >/dev/null
	fi
	rm -rf "$usr_src"
	mkdir -p "$usr_src"
	cp -R "$build/." "$usr_src"
	rm -rf "$build"
	say "DKMS: building gpushare $version for kernel $kernel"
	dkms add -m gpushare -v "$version" >/dev/null
	if ! dkms build -m gpushare -v "$version" -k "$kernel" >/dev/null; then
		cat "/var/lib/dkms/gpushare/$version/build/make.log" >&2 2>/dev/null || true
		die "DKMS could not build gpushare $version for $kernel (the log is above); the versions DKMS had are kept"
	fi
	# Built: only now the older versions go, so that a failed build leaves
	# the node with the module it had.
	for old in $(dkms_versions); do
		[ "$old" != "$version" ] || continue
		say "removing gpushare $old from DKMS"
		dkms remove -m gpushare -v "$old" --all >/dev/null
		rm -rf "/usr/src/gpushare-$old"
	done
	dkms install -m gpushare -v "$version" -k "$kernel" --force >/dev/null
	ko=$(find "/lib/modules/$kernel/updates/dkms" -name 'gpushare.ko*' 2>/dev/null | head -n 1)
	[ -n "$ko" ] || die "DKMS did not install gpushare.ko for $kernel"
	say "installed $ko"
	modules_load
}

modules_load() {
	mkdir -p "$(dirname "$MODULES_LOAD")"
	printf '# nri-gpushare: load gpushare.ko at boot (scripts/install-node.sh)\ngpushare\n' >"$MODULES_LOAD"
	if [ -r "$kmod_root/version" ] && [ "$(cat "$kmod_root/version")" != "$version" ]; then
		say "gpushare $(cat "$kmod_root/version") is loaded: 'nri-gpushare kmod-upgrade' makes $version take over now, keeping every container's registration (docs/install.md); otherwise it does at the next reboot"
	fi
}

do_install() {
	install_packages
	install_daemon
	install_config
	install_interposer
	[ "$with_kmod" = 0 ] || install_kmod
	install_unit
	if have_systemd; then
		systemctl daemon-reload
		systemctl enable nri-gpushare.service
		# A running daemon is restarted on the new version; containers are
		# not touched by a restart.
		systemctl try-restart nri-gpushare.service
	else
		say "systemd is not running here: skipped 'systemctl daemon-reload', 'enable' and 'try-restart'"
	fi
	say "installed nri-gpushare $version"
	say "next: 'nri-gpushare enable' (NRI in containerd), 'systemctl restart containerd', 'systemctl start nri-gpushare'"
}

# ---------------------------------------------------------------- interposer versions

# Whether a mount namespace on this node has $1 (a path under $LIBDIR)
# mounted: a container's bind mount of the file shows it as the mount's root
# in /proc/<pid>/mountinfo (field 4; the path within its filesystem, so the
# tail after /lib/ is compared).
mounted_somewhere() {
	tail=${1#/usr}
	cat /proc/[0-9]*/mountinfo 2>/dev/null | awk -v t="$tail" '
		{ n = length($4) - length(t) }
		n >= 0 && substr($4, n + 1) == t { found = 1 }
		END { exit !found }'
}

# The CDI spec that names $1 (a path under $LIBDIR), if one does: a CDI
# container created later mounts the version its spec names.
cdi_spec_naming() {
	for spec in /etc/cdi/* /var/run/cdi/*; do
		if [ -f "$spec" ] && grep -qF "$1" "$spec"; then
			echo "$spec"
			return 0
		fi
	done
	return 1
}

prune_interposers() {
	[ -d "$LIBDIR" ] || return 0
	current=$(readlink "$LIBLINK" 2>/dev/null || true)
	for dir in "$LIBDIR"/*/; do
		[ -d "$dir" ] || continue
		v=$(basename "$dir")
		lib=$LIBDIR/$v/libgpushare.so
		if [ "$1" = keep-current ] && [ "$current" = "$v/libgpushare.so" ]; then
			continue
		fi
		if mounted_somewhere "$lib"; then
			say "keeping interposer $v: a container has it mounted"
			continue
		fi
		if spec=$(cdi_spec_naming "$lib"); then
			say "keeping interposer $v: $spec names it (CDI containers created from now on mount it); 'nri-gpushare cdi generate' names the current one"
			continue
		fi
		rm -rf "${LIBDIR:?}/$v"
		say "removed interposer $v"
	done
}

# ---------------------------------------------------------------- uninstall

do_uninstall() {
	# 1. The module, unless containers are registered: then stop here.
	if [ -x "$VENV/bin/nri-gpushare" ]; then
		if ! "$VENV/bin/nri-gpushare" uninstall --kmod-root "$kmod_root"; then
			die "nothing was removed: gpushare.ko is still in use (see above)"
		fi
	elif [ -d /sys/module/gpushare ]; then
		# No daemon to ask: the kernel refuses while a container holds it.
		modprobe -r gpushare || die "nothing was removed: gpushare.ko could not be unloaded"
	fi
	# 2. The service.
	if [ -e "$UNIT" ]; then
		systemctl_or_note disable --now nri-gpushare.service
	fi
	# 3. The module's files.
	if command -v dkms >/dev/null; then
		for old in $(dkms_versions); do
			dkms remove -m gpushare -v "$old" --all >/dev/null
			rm -rf "/usr/src/gpushare-$old"
			say "removed gpushare $old from DKMS"
		done
	fi
	rm -f "$MODULES_LOAD"
	# 4. The rest.
	rm -f "$UNIT"
	rm -rf "$DOC"
	# The directories install made for them, when nothing else is there.
	for dir in "$UNIT_DIR" "$(dirname "$UNIT_DIR")" "$(dirname "$DOC")"; do
		rmdir "$dir" 2>/dev/null || true
	done
	have_systemd && systemctl daemon-reload
	for cmd in $COMMANDS; do
		link=/usr/local/bin/$cmd
		case $(readlink "$link" 2>/dev/null) in
		"$VENV"/*) rm -f "$link" ;;
		esac
	done
	rm -rf "$VENV"
	rmdir "$PREFIX" 2>/dev/null || true
	rm -f "$LIBLINK"
	if [ "$purge" = 1 ]; then
		prune_interposers all
		rmdir "$LIBDIR" 2>/dev/null || true
		rm -rf "$ETC" "$STATE_DIR"
		say "purged $ETC and $STATE_DIR"
	else
		say "kept $ETC, $STATE_DIR and the interposer versions in $LIBDIR (--purge removes them)"
	fi
	say "uninstalled nri-gpushare"
}

case $action in
install) do_install ;;
uninstall) do_uninstall ;;
prune) prune_interposers keep-current ;;
esac
