"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

_UMASK_LOCK = threading.Lock()


def umask(status: Path = Path("/proc/self/status")) -> int:
    """The process's umask, read without changing it where Linux reports it (`Umask:` in `/proc/self/status`);
    elsewhere set and restored at once under a lock (another thread creating a file in between would get 0o022)."""
    with contextlib.suppress(OSError, ValueError):
        for line in status.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, executable: bool = False, **kwargs: Any) -> Iterator[IO[Any]]:
    """A file written beside `path`, flushed to disk and renamed over it when the block ends without an error, so
    that `path` is whole or as it was (a full disk, a failed write, an interrupt, SIGKILL or a power loss leaves no
    half-written file). It gets the permissions of any new file (0o666, or 0o777 where `executable`, less the
    umask), not the temporary file's 0o600. `mode` is "w" or "wb"; `kwargs` go to `open` (e.g. `encoding`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, (0o777 if executable else 0o666) & ~umask())
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_whole(path: str | Path, data: bytes) -> None:
    """`data` written to `path` whole or not at all (`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)
