"""The metadata key table of docs/ARCHITECTURE.md is the one tiered/metadata/keys.py builds:
each row, with its placeholders filled in, is a key the module builds, and every key the
module builds has a row."""
from __future__ import annotations

import os
import re

from tiered.metadata import keys

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ARCHITECTURE.md")

TOPIC, BROKER, SUB, START, EPOCH, STARTED_MS, MOVE = "/ns1/t1", "b1", "s1", 5, 3, 1_700_000_000_000, "m1"
PLACEHOLDERS = {
    "<ns>": "ns1", "<topic>": "t1", "<broker_id>": BROKER, "<name>": SUB, "<move_id>": MOVE,
    "<start, 20 digits>": f"{START:020d}", "<epoch, 20 digits>": f"{EPOCH:020d}",
    "<ms, 20 digits>": f"{STARTED_MS:020d}",
}


def built() -> set[str]:
    return {
        keys.descriptor_key(TOPIC, START), keys.state_key(TOPIC), keys.owner_key(TOPIC),
        keys.progress_key(TOPIC), keys.tombstone_key(TOPIC), keys.archive_start_key(TOPIC), keys.lost_key(TOPIC, START, EPOCH), keys.cursor_key(TOPIC, SUB),
        keys.delivery_key(TOPIC), keys.assignment_key(BROKER, TOPIC), keys.unassigned_key(TOPIC),
        keys.registered_key(BROKER), keys.LEADER_KEY, keys.placement_key(TOPIC),
        keys.broker_state_key(BROKER), keys.load_key(BROKER), keys.history_key(STARTED_MS / 1000, MOVE),
        keys.LM_CONFIG_KEY, keys.REBALANCE_REQUEST_KEY,
    }


def documented() -> set[str]:
    with open(DOC) as f:
        text = f.read()
    table = text[text.index("## Key layout (metadata)"):text.index("## Fencing")]
    rows = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    out = set()
    for row in rows:
        for placeholder, value in PLACEHOLDERS.items():
            row = row.replace(placeholder, value)
        assert "<" not in row, f"unknown placeholder in {row!r}"
        out.add(row)
    return out


def test_the_documented_key_table_is_what_keys_py_builds() -> None:
    assert documented() == built()
