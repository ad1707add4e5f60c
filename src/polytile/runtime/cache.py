"""Content-hashed on-disk cache of compiled kernels, safe against other users and concurrency."""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile


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
