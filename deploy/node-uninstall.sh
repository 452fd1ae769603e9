#!/bin/sh
# The uninstall Job (deploy/uninstall-job.yaml): removes nri-gpushare from
# this node with the node installer's --uninstall, run on the node itself
# (nsenter into PID 1's namespaces; the pod has hostPID).  Run it after the
# node's GPU pods are gone and the DaemonSet no longer runs here
# (docs/kubernetes.md, "Uninstall"): `nri-gpushare uninstall` refuses while
# containers are registered, and then nothing is removed.
#
# Environment: PURGE=1 also removes /etc/nri-gpushare and /var/lib/nri-gpushare.
set -eu

SRC=/opt/nri-gpushare/src
HOST=${HOST_ROOT:-/host} # where the node's /opt/nri-gpushare is mounted

say() { echo "node-uninstall: $*"; }
on_node() { nsenter --target 1 --mount --uts --ipc --net --pid -- "$@"; }

# The DaemonSet's device plugin or DRA driver still running here would go on
# advertising (and, its venv gone, crash-loop) and its pod would install
# everything again.
PLUGIN_SOCKET=${PLUGIN_SOCKET:-/var/lib/kubelet/device-plugins/gpushare-gpu-memory.sock}
DRA_SOCKET=${DRA_SOCKET:-/var/lib/kubelet/plugins_registry/gpushare.io-reg.sock}
for socket in "$PLUGIN_SOCKET" "$DRA_SOCKET"; do
	if on_node test -S "$socket"; then
		echo "node-uninstall: the device plugin's or DRA driver's socket $socket is there: the DaemonSet still runs on this node; stop it first (kubectl label node <node> gpushare.io/enabled-; docs/kubernetes.md \"Uninstall\"), then run this Job again (a socket left by a killed plugin: remove it on the node). Nothing was removed" >&2
		exit 1
	fi
done

if ! on_node test -f "$SRC/scripts/install-node.sh"; then
	# Not installed by the DaemonSet (or already removed): use the image's tree.
	mkdir -p "$HOST/opt/nri-gpushare"
	rm -rf "$HOST$SRC"
	cp -a "$SRC" "$HOST$SRC"
	say "the node had no $SRC: using this image's copy"
fi
purge=""
if [ "${PURGE:-0}" = 1 ]; then purge=--purge; fi
if ! on_node sh "$SRC/scripts/install-node.sh" --uninstall $purge; then
	echo "node-uninstall: nothing was removed (see above); drain the node's GPU pods, then run this Job again" >&2
	exit 1
fi
# What the DaemonSet added besides install-node.sh's files.
on_node rm -rf "$SRC" /run/nri-gpushare/kubernetes
on_node rmdir /opt/nri-gpushare 2>/dev/null || true
say "removed nri-gpushare from this node; containerd's NRI setting stays ('nri-gpushare disable' before uninstalling puts it back)"
