#!/bin/sh
# Run a command as root inside Debian bookworm's 6.1 kernel under qemu (TCG),
# or GPUSHARE_GUEST_KERNEL's (6.12, 7.2: scripts/kernel-roots.sh), with the
# host's / shared read-only under a throwaway tmpfs layer.
#
#   scripts/run-in-guest.sh [--timeout S] [--rwdir DIR]... [--load-module KO]...
#                           [--cwd DIR] [--env NAME=VALUE]... [--serial-log FILE] -- CMD...
#
# A single CMD word is run by sh -c ('exit 3'); several are an argv.  Exit
# status: CMD's; 124 when the run timed out; 125 when the guest failed
# (kernel panic or oops, boot failure, missing prerequisite).  The guest's
# console streams to stdout.  See tests/guest/harness/vm.py.
top=$(cd "$(dirname "$0")/.." && pwd)
py=$top/.venv/bin/python
[ -x "$py" ] || py=python3
exec "$py" "$top/tests/guest/harness/vm.py" "$@"
