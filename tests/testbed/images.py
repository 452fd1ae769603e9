"""Local OCI images for the test bed: busybox-static, no registry needed.

One tar in OCI image-layout holds two images sharing one uncompressed layer
(/bin/busybox, its applet symlinks, /etc/passwd):

- BUSYBOX_IMAGE: the general-purpose image (Cmd: /bin/sh).
- PAUSE_IMAGE: CRI's sandbox_image (Cmd: /bin/sleep infinity).

Both carry fully qualified names: CRI only sees images imported under such
names without a containerd restart.  Tars are cached by content under
.cache/images so later runs skip the build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import tarfile
from pathlib import Path

BUSYBOX_IMAGE = "docker.io/gpushare/busybox:test"
PAUSE_IMAGE = "docker.io/gpushare/pause:test"
BUSYBOX_BINARY = Path("/bin/busybox")
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache" / "images"

_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IMAGES = {BUSYBOX_IMAGE: ["/bin/sh"], PAUSE_IMAGE: ["/bin/sleep", "infinity"]}
_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_CONFIG = "application/vnd.oci.image.config.v1+json"
_LAYER = "application/vnd.oci.image.layer.v1.tar"


def is_static_elf(path: Path) -> bool:
    """True for a 64-bit little-endian ELF without a PT_INTERP (dynamic loader)."""
    with path.open("rb") as f:
        head = f.read(64)
        if head[:6] != b"\x7fELF\x02\x01":
            return False
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    return sorted({a for a in out.stdout.split() if a and "/" not in a and a != "busybox"})


def _layer(busybox: Path) -> bytes:
    """A reproducible tar: fixed mtimes, root owner, sorted entries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, kind: bytes, data: bytes = b"", mode: int = 0o755, link: str = ""):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = kind, mode, 0
            info.linkname, info.size = link, len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root", "usr", "usr/bin"):
            add(d, tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", tarfile.REGTYPE, busybox.read_bytes())
        for applet in _applets(busybox):
            add(f"bin/{applet}", tarfile.SYMTYPE, link="busybox", mode=0o777)
        add("etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        add("etc/group", tarfile.REGTYPE, b"root:x:0:\n", 0o644)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _image_config(cmd: list[str], env: dict[str, str], labels: dict[str, str]) -> dict:
    config: dict[str, object] = {
        "Cmd": cmd,
        "Env": [_PATH] + [f"{k}={v}" for k, v in env.items()],
        "WorkingDir": "/",
    }
    if labels:
        config["Labels"] = labels
    return config


def _layout(layer: bytes, images: dict[str, dict] | None = None) -> bytes:
    """An OCI layout holding `images` (name -> image config), all on `layer`."""
    if images is None:
        images = {name: _image_config(cmd, {}, {}) for name, cmd in _IMAGES.items()}
    blobs: dict[str, bytes] = {_digest(layer): layer}
    entries = []
    for name, image_config in images.items():
        config = _json(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": image_config,
                "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
            }
        )
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": _MANIFEST,
                "config": {"mediaType": _CONFIG, "digest": _digest(config), "size": len(config)},
                "layers": [{"mediaType": _LAYER, "digest": _digest(layer), "size": len(layer)}],
            }
        )
        blobs[_digest(config)] = config
        blobs[_digest(manifest)] = manifest
        entries.append(
            {
                "mediaType": _MANIFEST,
                "digest": _digest(manifest),
                "size": len(manifest),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        )
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": _json({"schemaVersion": 2, "manifests": entries}),
    }
    files |= {f"blobs/sha256/{d.split(':', 1)[1]}": b for d, b in blobs.items()}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_images(busybox: Path = BUSYBOX_BINARY, cache_dir: Path = CACHE_DIR) -> Path:
    """Return the path of the OCI layout tar, building it unless cached."""
    if not is_static_elf(busybox):
        raise RuntimeError(f"{busybox} is not a static binary: install busybox-static")
    key = hashlib.sha256(busybox.read_bytes() + _json(_IMAGES)).hexdigest()[:16]
    path = cache_dir / f"gpushare-busybox-{key}.tar"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(_layout(_layer(busybox)))
        tmp.replace(path)
    return path


def build_custom_image(
    name: str,
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    busybox: Path = BUSYBOX_BINARY,
    cache_dir: Path = CACHE_DIR,
) -> Path:
    """An OCI layout tar with one busybox image named `name` whose config
    carries `env` (as a Dockerfile's ENV) and `labels` (LABEL)."""
    if not is_static_elf(busybox):
        raise RuntimeError(f"{busybox} is not a static binary: install busybox-static")
    images = {name: _image_config(["/bin/sh"], dict(env or {}), dict(labels or {}))}
    key = hashlib.sha256(busybox.read_bytes() + _json(images)).hexdigest()[:16]
    path = cache_dir / f"gpushare-custom-{key}.tar"
    if not path.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(_layout(_layer(busybox), images))
        tmp.replace(path)
    return path


def image_names(tar: Path) -> list[str]:
    """The names (io.containerd.image.name) of the images in an OCI layout tar."""
    with tarfile.open(tar) as layout:
        index = layout.extractfile("index.json")
        assert index is not None
        manifests = json.loads(index.read())["manifests"]
    return [m["annotations"]["io.containerd.image.name"] for m in manifests]


def import_images(ctr: Path | str, socket: Path | str, tar: Path | None = None) -> None:
    """Import both images into the CRI namespace of the containerd at socket."""
    tar = tar or build_images()
    cmd = [str(ctr), "-a", str(socket), "-n", "k8s.io", "images", "import", str(tar)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
