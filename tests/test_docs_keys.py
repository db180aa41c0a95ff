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


# -- every other key example in the docs ------------------------------------------------

REPO = os.path.dirname(os.path.dirname(DOC))
DOCS = [os.path.join(REPO, "README.md")] + sorted(
    os.path.join(REPO, "docs", name) for name in os.listdir(os.path.join(REPO, "docs")) if name.endswith(".md"))
#: Keys the docs name only to say they are *not* used.
NOT_USED = {"/cluster/lm/requests"}
#: Placeholders with a fixed shape; any other ``<...>`` stands for one key segment.
SHAPED = {"<start:020d>": r"\d{20}", "<epoch:020d>": r"\d{20}", "<start, 20 digits>": r"\d{20}",
          "<epoch, 20 digits>": r"\d{20}", "<ms, 20 digits>": r"\d{20}"}
#: Concrete names the docs use in examples, besides the placeholders.
EXAMPLE_BROKERS = ("broker-7",)


def _pattern(example: str) -> re.Pattern[str]:
    """``<...>`` is one key segment (or a shaped one), ``*`` anything below."""
    parts = re.split(r"(<[^>]+>|\*)", example)
    return re.compile("".join(
        SHAPED.get(p, r"[^/]+") if p.startswith("<") else ".*" if p == "*" else re.escape(p) for p in parts))


def _candidates() -> set[str]:
    out = built() | {keys.objects_prefix(TOPIC), keys.lost_prefix(TOPIC), keys.subscriptions_prefix(TOPIC)}
    out |= {keys.assignment_key(b, TOPIC) for b in EXAMPLE_BROKERS}
    return out


def _examples(text: str) -> list[str]:
    """Backticked metadata keys and key prefixes (a word may follow the key, as in
    ``/cluster/load/<id>`` every 30 s)."""
    return [m.group(1) for m in re.finditer(r"`(/(?:storage|topics|cluster)/(?:<[^>`]*>|[^`\s)<])*)", text)]


def test_every_metadata_key_example_in_the_docs_is_one_keys_py_builds() -> None:
    candidates = _candidates()
    wrong = []
    for path in DOCS:
        with open(path) as f:
            text = f.read()
        for example in _examples(text):
            if example in NOT_USED:
                continue
            pattern = _pattern(example)
            prefix = example.endswith("/")
            if not any(pattern.fullmatch(k) or (prefix and pattern.match(k)) for k in candidates):
                wrong.append(f"{os.path.basename(path)}: {example}")
    assert wrong == []


def test_every_object_key_example_in_the_docs_is_what_naming_builds() -> None:
    from tiered.archive import naming
    from wal.topics import TopicName

    topic = TopicName.parse(TOPIC)
    start, end = START, START + 9
    template = naming.object_key(topic, start, naming.object_id_for(start, end, EPOCH))
    nonce = naming.object_key(topic, start, naming.object_id_for(start, end, EPOCH, nonce="ab12"))
    filled = {"<ns>": "ns1", "<topic>": "t1", "<start>": str(start), "<end>": str(end), "<epoch>": str(EPOCH)}
    wrong = []
    for path in DOCS:
        with open(path) as f:
            text = f.read()
        for example in re.findall(r"(?:<ns>/<topic>/)?data-<start>-<end>[^`\s,)]*\.dnb1", text):
            key = example if example.startswith("<ns>") else "<ns>/<topic>/" + example
            for placeholder, value in filled.items():
                key = key.replace(placeholder, value)
            if key not in (template, nonce):
                wrong.append(f"{os.path.basename(path)}: {example}")
        # Concrete names (the README's walk-through): each must parse as an object key.
        for concrete in re.findall(r"\bdata-\d+-\d+[^\s`]*\.dnb1", text):
            name = naming.parse_object_key(topic, f"ns1/t1/{concrete}")
            if name is None or name.epoch is None:
                wrong.append(f"{os.path.basename(path)}: {concrete}")
    assert wrong == []


def test_the_stores_md_key_table_is_what_keys_py_builds() -> None:
    from tiered.archive import naming

    with open(os.path.join(REPO, "docs", "STORES.md")) as f:
        text = f.read()
    table = text[text.index("## Key layout"):text.index("## Errors")]
    rows = re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)
    metadata_rows = [r for r in rows if r.startswith("/")]
    assert len(metadata_rows) >= 7
    for row in metadata_rows:
        assert any(_pattern(row).fullmatch(k) for k in built()), row
    assert "object key: `<ns>/<topic>/<object_id>.dnb1`, `object_id = data-<start>-<end>-e<epoch>[-<nonce>]`" \
        in table
    assert naming.object_key(TOPIC, START, "data-5-9-e3") == "ns1/t1/data-5-9-e3.dnb1"
