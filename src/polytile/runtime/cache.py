"""Content-hashed on-disk cache of compiled kernels, safe against other users and concurrency."""
from __future__ import annotations

import hashlib
import logging
import os
import stat
import tempfile

log = logging.getLogger("polytile")
_fallback_dirs: dict[str, str] = {}


class UnsafeCacheDir(RuntimeError):
    pass


def ensure_private_dir(path: str) -> str:
    """Create ``path`` with mode 0700 if needed; refuse a directory other users could write."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid():
        raise UnsafeCacheDir(f"polytile cache dir {path} is owned by uid {st.st_uid}, not by you")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDir(f"polytile cache dir {path} is writable by other users (mode "
                             f"{oct(st.st_mode & 0o777)}); use chmod 700 or another cache_dir")
    return path


def usable_dir(path: str) -> str:
    """``path`` made private (``ensure_private_dir``) and checked writable; when it cannot be
    created or written (a read-only home, a file in the way, a full disk), a private temporary
    directory for this process instead, with one warning. A directory other users could write
    is refused (``UnsafeCacheDir``), never replaced silently."""
    if path in _fallback_dirs:
        return _fallback_dirs[path]
    try:
        ensure_private_dir(path)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return path
    except UnsafeCacheDir:
        raise
    except OSError as e:
        tmp = tempfile.mkdtemp(prefix="polytile-cache-")
        log.warning("polytile: cache dir %s is not usable (%s); compiling into %s for this process", path, e, tmp)
        _fallback_dirs[path] = tmp
        return tmp


def checksum_path(so_path: str) -> str:
    return so_path + ".sha256"


def file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def intact(so_path: str) -> bool:
    """Whether a cached object is there and whole: its digest, written after it, matches."""
    try:
        with open(checksum_path(so_path)) as f:
            return f.read().strip() == file_digest(so_path)
    except OSError:
        return False


def discard(so_path: str) -> None:
    """Remove a cache entry (its digest first, so that it is never taken for whole)."""
    for p in (checksum_path(so_path), so_path):
        try:
            os.unlink(p)
        except OSError:
            pass


def key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def atomic_write_bytes(path: str, data: bytes) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
