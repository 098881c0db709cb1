"""JSON lines read from a file, each error naming the file and the line at fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["read_jsonl"]


def read_jsonl(path: Path, what: str) -> list[tuple[int, Any]]:
    """The line number and value of each non-blank line of ``path`` (``what`` names it).

    Raises:
        ValueError: the file cannot be read, or a line is not UTF-8 or not JSON.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        where = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{where}: not UTF-8") from None
    values = []
    for lineno, line in enumerate(lines, start=1):
        if line.strip():
            try:
                values.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            except RecursionError:
                raise ValueError(f"{path}:{lineno}: JSON nested too deep") from None
    return values
