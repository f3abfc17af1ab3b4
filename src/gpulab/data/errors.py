"""The one error type of the data stage: says which file and which line/key is wrong."""
from __future__ import annotations

import os


class DataError(ValueError):
    """Bad input data. The message always names the file and, where known, the line or key."""

    def __init__(self, path: str | os.PathLike, problem: str, *, line: int | None = None,
                 key: str | None = None):
        self.path, self.problem, self.line, self.key = str(path), problem, line, key
        where = self.path
        if line is not None:
            where += f", line {line}"
        if key is not None:
            where += f", key {key!r}"
        super().__init__(f"{where}: {problem}")
