"""Keeps docs/FORMAT.md a verbatim mirror of the three spec docstrings (the format is written once)."""
from __future__ import annotations

from pathlib import Path

import native.format as _wal_format
import native.journal_format as _journal_format
import native.object_format as _object_format

FORMAT_MD = Path(__file__).resolve().parent.parent / "docs" / "FORMAT.md"

_PREAMBLE = """# dnb-storage on-disk formats

This file mirrors the three specification docstrings verbatim: `native/format.py` (WAL segments,
frames, records), `native/journal_format.py` (a WAL root's shared journal) and
`native/object_format.py` (dnb1 archive objects). The docstrings are the
source of truth; `tests/native/test_docs.py` fails when this file drifts from them. Regenerate
with `python -c "import native.docs_sync as d; d.write()"`.
"""


def render() -> str:
    return (_PREAMBLE
            + "\n## WAL segments, frames and records (`native/format.py`)\n\n```text\n"
            + _wal_format.__doc__.strip()
            + "\n```\n\n## The shared journal (`native/journal_format.py`)\n\n```text\n"
            + _journal_format.__doc__.strip()
            + "\n```\n\n## dnb1 archive objects (`native/object_format.py`)\n\n```text\n"
            + _object_format.__doc__.strip() + "\n```\n")


def write() -> None:
    FORMAT_MD.write_text(render())
