"""The CDI device of a prepared claim: ``gpushare.io/claim=<claim UID>``, one
spec file per claim in the runtime's CDI directory, written at prepare and
removed at unprepare.

Its only edit is the claim's variable (`CLAIM_ENV`): the container runtime
applies it before NRI's CreateContainer, where the plugin finds the claim
by it and injects what every share gets (GPU nodes, the share's
environment, the interposer) from the claim's booking.  The device itself
gives no GPU node: a container created while the plugin is not serving
gets no GPU at all (it fails closed), and the share's values are never
read from a file a container could see.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from nri_gpushare.k8s.dra import CDI_KIND, CLAIM_ENV, ClaimError
from nri_gpushare.share.claim_model import is_uid

CDI_VERSION = "0.5.0"
"""Device names beginning with a digit (a UID) need 0.5.0."""
PREFIX = "gpushare.io-claim_"


def cdi_id(uid: str) -> str:
    """The fully qualified CDI device name of claim `uid`."""
    return f"{CDI_KIND}={uid}"


def spec_path(directory: str, uid: str) -> Path:
    return Path(directory, f"{PREFIX}{uid}.json")


def spec(uid: str) -> dict[str, object]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": uid, "containerEdits": {"env": [f"{CLAIM_ENV}={uid}"]}}],
    }


def write_spec(directory: str, uid: str) -> str:
    """Write claim `uid`'s spec (atomically, mode 0644; the directory made
    0755 when missing); its CDI device name.  ClaimError when it cannot."""
    if not is_uid(uid):
        raise ClaimError(f"claim UID {uid[:80]!r} is not a Kubernetes UID")
    path = spec_path(directory, uid)
    data = json.dumps(spec(uid), indent=2, sort_keys=True).encode() + b"\n"
    try:
        os.makedirs(directory, 0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{PREFIX}", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.rename(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        raise ClaimError(
            f"cannot write the claim's CDI spec {path}: {e.strerror or e} (is the CDI "
            f"directory {directory} mounted read-write?)"
        ) from None
    return cdi_id(uid)


def remove_spec(directory: str, uid: str) -> None:
    """Remove claim `uid`'s spec (none there: nothing to do); ClaimError when it cannot."""
    if not is_uid(uid):
        return  # never written
    path = spec_path(directory, uid)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ClaimError(f"cannot remove the claim's CDI spec {path}: {e.strerror or e}") from None


def written(directory: str) -> set[str]:
    """The UIDs whose specs are in `directory`."""
    try:
        names = os.listdir(directory)
    except OSError:
        return set()
    return {
        n[len(PREFIX) : -len(".json")]
        for n in names
        if n.startswith(PREFIX) and n.endswith(".json")
    }
