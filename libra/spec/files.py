"""Files written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "w", *, executable: bool = False, **kwargs: Any) -> Iterator[IO[Any]]:
    """A file written beside `path` and renamed over it when the block ends without an error, so that `path` is
    whole or as it was (a full disk, a failed write or an interrupt leaves no half-written file). It gets the
    permissions of any new file (0o666, or 0o777 where `executable`, less the umask), not the temporary file's
    0o600. `mode` is "w" or "wb"; `kwargs` go to `open` (e.g. `encoding`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, (0o777 if executable else 0o666) & ~_umask())
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
