"""JSON lines read from a file, each error naming the file and the line at fault."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["FILE_BYTES", "LINE_BYTES", "read_jsonl"]

#: The longest line read (a record of recorded answers is a few kB).
LINE_BYTES = 16 << 20
#: The largest file read: a device or pipe that never ends stops here too.
FILE_BYTES = 256 << 20


def read_jsonl(path: Path, what: str) -> list[tuple[int, Any]]:
    """The line number and value of each non-blank line of ``path`` (``what`` names it).

    The file is read a line at a time, at most :data:`FILE_BYTES` of it and
    :data:`LINE_BYTES` a line, so that no file (``/dev/zero``) takes the memory.

    Raises:
        ValueError: the file cannot be read, is too large, or a line is too
            long, not UTF-8, not JSON or nested too deep.
    """
    values = []
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > FILE_BYTES:
                raise ValueError(f"{path}: larger than {_mib(FILE_BYTES)} ({size:,} bytes)")
            read = 0
            lines = iter(lambda: file.readline(LINE_BYTES + 1), b"")
            for lineno, raw in enumerate(lines, start=1):
                read += len(raw)
                if len(raw) > LINE_BYTES:
                    raise ValueError(f"{path}:{lineno}: a line longer than {_mib(LINE_BYTES)}")
                if read > FILE_BYTES:
                    raise ValueError(f"{path}: larger than {_mib(FILE_BYTES)}")
                value = _parse(raw, path, lineno)
                if value is not _BLANK:
                    values.append((lineno, value))
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from exc
    return values


_BLANK = object()


def _parse(raw: bytes, path: Path, lineno: int) -> Any:
    """Line ``lineno`` of ``path`` parsed (``_BLANK``: only whitespace)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}:{lineno}: not UTF-8") from None
    if not line.strip():
        return _BLANK
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    except RecursionError:
        raise ValueError(f"{path}:{lineno}: JSON nested too deep") from None
    except ValueError as exc:  # an integer of too many digits
        raise ValueError(f"{path}:{lineno}: {exc}") from None


def _mib(size: int) -> str:
    return f"{size >> 20} MiB" if size % (1 << 20) == 0 else f"{size:,} bytes"
