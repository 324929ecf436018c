"""Named SQL queries loaded from ``.sql`` files that sit next to the repository that runs them.

A file holds queries under headers ``-- name: admit_command --``; the comment lines that
follow the header are the query's one-line purpose. Queries are loaded once and always run
with bound parameters — ``$1, $2, ...`` for asyncpg, ``%(name)s`` for psycopg2 (the relay's
replication connection): values are never interpolated into SQL text.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_HEADER = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*--\s*$", re.MULTILINE)


@cache
def load(path: Path) -> dict[str, str]:
    """Parse a queries file into ``{name: sql}``.

    Args:
        path: the ``.sql`` file.

    Raises:
        ValueError: if a name is repeated or the file holds text before the first header.
    """
    text = path.read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    if parts[0].strip() and not all(
        line.startswith("--") for line in parts[0].strip().splitlines()
    ):
        raise ValueError(f"{path}: SQL before the first '-- name: ... --' header")
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} defined twice")
        queries[name] = body.strip()
    return queries
