#!/bin/sh
# The DaemonSet's init container (deploy/daemonset.yaml): installs
# nri-gpushare on this node from the project tree shipped in the image, with
# the node installer of docs/install.md, and leaves the daemon running under
# the node's systemd (so it serves containerd whatever happens to this pod).
#
# 1. checks the ConfigMap's gpushare.yaml with the image's own parser;
# 2. copies the tree to the node's /opt/nri-gpushare/src (whole, by rename);
# 3. writes the config to the node's /etc/nri-gpushare/gpushare.yaml;
# 4. runs scripts/install-node.sh there (venv, unit, interposer, DKMS module);
# 5. `nri-gpushare enable`, and restarts containerd when that changed its
#    config or NRI's socket is missing (running containers keep running:
#    their shims outlive containerd);
# 6. `systemctl enable --now nri-gpushare` and waits for its status socket.
#
# Steps 4-6 run on the node itself (nsenter into PID 1's namespaces; the pod
# has hostPID).  Idempotent: a pod restart re-runs it; with the same image it
# skips step 4 (and restarts the daemon only for a changed config), with a
# new one it upgrades (install-node.sh restarts the daemon; running
# containers are not touched).
#
# Environment: INSTALL_ARGS (extra install-node.sh arguments, e.g. --no-kmod),
# CONTAINERD_CONFIG (default /etc/containerd/config.toml; set but empty: NRI
# is the operator's to turn on, as on k3s and RKE2, whose containerd config is
# generated from a template and whose containerd is not containerd.service:
# steps 5's enable and restart are skipped, and NRI's socket must be there),
# WAIT_SECONDS (60);
# CONFIG_IN and HOST_ROOT: where the pod mounts the ConfigMap's file and the
# node's /opt/nri-gpushare and /etc/nri-gpushare (/config, /host).
set -eu

SRC=/opt/nri-gpushare/src
VENV=/opt/nri-gpushare/venv
ETC=/etc/nri-gpushare
CONFIG=$ETC/gpushare.yaml
CONFIG_IN=${CONFIG_IN:-/config/gpushare.yaml} # the ConfigMap's mount
HOST=${HOST_ROOT:-/host}                       # where the node's directories are mounted
CONTAINERD_CONFIG=${CONTAINERD_CONFIG-/etc/containerd/config.toml}
WAIT_SECONDS=${WAIT_SECONDS:-60}
STAMP=.installed-by-daemonset

say() { echo "node-install: $*"; }
die() {
	echo "node-install: $*" >&2
	exit 1
}
on_node() { nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; }

# 1. A bad ConfigMap stops here, before the node is touched.
setting() {
	"$VENV/bin/python" - "$CONFIG_IN" "$1" <<'PY'
import sys
from nri_gpushare.config import ConfigError, load_config
try:
    config = load_config(sys.argv[1])
except ConfigError as exc:
    sys.exit(f"node-install: the ConfigMap's gpushare.yaml: {exc}")
print(getattr(config, sys.argv[2]))
PY
}
nri_socket=$(setting socket) || exit 1
status_socket=$(setting status_socket) || exit 1
say "config checked: NRI socket $nri_socket, status socket $status_socket"

# 2. The tree, replaced whole: install-node.sh runs from it, and the
# uninstall Job (deploy/uninstall-job.yaml) later runs its --uninstall.  The
# stamp a successful install leaves in it says which tree was installed: a
# pod restart with the same image and INSTALL_ARGS installs nothing again
# (install-node.sh would restart the daemon for nothing).
tree=$(cd "$SRC" && find . -type f ! -name "$STAMP" -print0 | sort -z | xargs -0 sha256sum |
	sha256sum | cut -d' ' -f1)
tree="$tree ${INSTALL_ARGS:-}"
installed=$(cat "$HOST$SRC/$STAMP" 2>/dev/null || true)
if [ "$installed" = "$tree" ] && on_node test -x "$VENV/bin/nri-gpushare"; then
	fresh=0
	say "the node has this image's tree installed already: install-node.sh is skipped"
else
	fresh=1
	mkdir -p "$HOST/opt/nri-gpushare"
	rm -rf "$HOST$SRC.new" "$HOST$SRC.old"
	cp -a "$SRC" "$HOST$SRC.new"
	if [ -e "$HOST$SRC" ]; then mv "$HOST$SRC" "$HOST$SRC.old"; fi
	mv "$HOST$SRC.new" "$HOST$SRC"
	rm -rf "$HOST$SRC.old"
	say "copied the project to the node's $SRC"
fi

# 3. The config (install-node.sh keeps an existing one, so this one stays).
mkdir -p "$HOST$ETC"
if cmp -s "$CONFIG_IN" "$HOST$CONFIG"; then
	config_changed=0
	say "$CONFIG is unchanged"
else
	config_changed=1
	cp "$CONFIG_IN" "$HOST$CONFIG.tmp"
	chmod 0644 "$HOST$CONFIG.tmp"
	mv "$HOST$CONFIG.tmp" "$HOST$CONFIG"
	say "wrote $CONFIG from the ConfigMap"
fi

# 4. The node installer (docs/install.md); it restarts a running daemon.
if [ "$fresh" = 1 ]; then
	# shellcheck disable=SC2086 # INSTALL_ARGS: one word per argument
	on_node sh "$SRC/scripts/install-node.sh" ${INSTALL_ARGS:-}
	echo "$tree" >"$HOST$SRC/$STAMP"
elif [ "$config_changed" = 1 ]; then
	say "restarting the daemon for the new config (running containers are not touched)"
	on_node systemctl try-restart nri-gpushare.service
fi

# 5. NRI in containerd.  containerd reads its config only at start.
# shellcheck disable=SC2016 # $1 is the inner shell's
checksum() { on_node sh -c 'sha256sum "$1" 2>/dev/null || echo none' sh "$CONTAINERD_CONFIG"; }
if [ -z "$CONTAINERD_CONFIG" ]; then
	on_node test -S "$nri_socket" ||
		die "CONTAINERD_CONFIG is empty (NRI is yours to turn on) and there is no NRI socket at $nri_socket: enable NRI in containerd's config (k3s and RKE2: its config.toml.tmpl, docs/kubernetes.md \"Deploy\"), restart containerd (k3s, rke2-agent, ...), then delete this pod"
	say "CONTAINERD_CONFIG is empty: containerd's config is left alone (NRI's socket is there)"
else
	before=$(checksum)
	on_node "$VENV/bin/nri-gpushare" enable --config "$CONTAINERD_CONFIG" --plugin-config "$CONFIG"
	after=$(checksum)
	if [ "$before" != "$after" ]; then
		say "containerd's config changed: restarting containerd (running containers keep running)"
		on_node systemctl restart containerd
	elif ! on_node test -S "$nri_socket"; then
		say "no NRI socket at $nri_socket: restarting containerd so that it reads its config"
		on_node systemctl restart containerd
	fi
fi

# 6. The daemon, under the node's systemd.  The kubelet made
# /run/nri-gpushare (0755) for the credentials container's volume before
# this ran; the daemon gives it 0750 only when it makes it itself.
on_node chmod 0750 /run/nri-gpushare
on_node systemctl enable --now nri-gpushare.service
waited=0
until on_node test -S "$status_socket"; do
	if [ "$waited" -ge "$WAIT_SECONDS" ]; then
		on_node systemctl --no-pager status nri-gpushare.service >&2 || true
		on_node journalctl --no-pager -n 30 -u nri-gpushare.service >&2 || true
		die "the daemon did not come up within ${WAIT_SECONDS}s (its journal is above)"
	fi
	sleep 1
	waited=$((waited + 1))
done
say "nri-gpushare is running on $(on_node hostname)"
