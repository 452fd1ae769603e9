#!/bin/sh
# Extract the kernel's checkpatch.pl (with spelling.txt and
# const_structs.checkpatch) from Debian's linux-source-6.1 package into
# .cache/linux-source, where `make checkpatch` finds it.  Downloads about
# 140 MB once; nothing is installed.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
dest="$top/.cache/linux-source"
if ls "$dest"/linux-source-*/scripts/checkpatch.pl >/dev/null 2>&1; then
	exit 0
fi
mkdir -p "$dest"
cd "$dest"
apt-get download -q linux-source-6.1
tarball=$(dpkg-deb -c linux-source-6.1_*.deb | awk '/\.tar\.xz$/ {print $NF; exit}')
dpkg-deb --fsys-tarfile linux-source-6.1_*.deb | tar -x "$tarball"
top_dir=$(basename "$tarball" .tar.xz)
tar -xJf "$tarball" "$top_dir/scripts/checkpatch.pl" \
	"$top_dir/scripts/spelling.txt" "$top_dir/scripts/const_structs.checkpatch"
rm -rf usr linux-source-6.1_*.deb
echo "checkpatch.pl: $dest/$top_dir/scripts/checkpatch.pl"
