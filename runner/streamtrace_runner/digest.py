"""sha256 without OpenSSL where the interpreter has its own: ``hashlib`` loads OpenSSL's
libcrypto, megabytes of resident memory in the runner's process (measured: docs/devices.md)
for the few megabytes it hashes when it starts; CPython's built-in sha256 gives the same
digests. Files are hashed in pieces (no copy of the whole file)."""
from __future__ import annotations

__all__ = ["sha256", "file_sha256"]


def _builtin():
    for name in ("_sha2", "_sha256"):        # CPython's own sha256 (3.12+, 3.11)
        try:
            return __import__(name).sha256
        except (ImportError, AttributeError):
            continue
    from hashlib import sha256 as openssl    # an interpreter built without it
    return openssl


sha256 = _builtin()


def file_sha256(path, chunk: int = 1 << 16) -> str:
    """The hex sha256 of the file ``path``.

    >>> import tempfile, hashlib, os
    >>> fd, p = tempfile.mkstemp(); _ = os.write(fd, b"abc" * 100000); os.close(fd)
    >>> file_sha256(p) == hashlib.sha256(b"abc" * 100000).hexdigest()
    True
    """
    h = sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
