"""docs/CONFIG.md lists every key with its default, env name, meaning and nearest
Kafka/Pulsar name, exactly as the dataclasses define them (the FORMAT.md pattern)."""
import dataclasses

from tiered.broker.config import BrokerProcessConfig
from tiered.cluster.config import FailoverConfig, LoadManagerConfig, RebalancingConfig, WeightedLoadConfig
from tiered.objects.config import ObjectStoreConfig
from tiered.config import docs_sync
from tiered.config.model import DnbConfig
from tiered.config.reference import KEYS
from tiered.config.schema import NOT_KEYS, by_env, by_name, keys
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.watcher import WatcherConfig
from uploader.config import ArchiveRetentionConfig, RetentionConfig, UploaderConfig
from wal.config import WalConfig

#: Every section dataclass by its prefix, listed here independently of the schema walk,
#: so a section the walk skipped would show up as undocumented fields.
SECTIONS = {"": DnbConfig, "wal": WalConfig, "uploader": UploaderConfig, "uploader.retention": RetentionConfig,
            "uploader.archive_retention": ArchiveRetentionConfig,
            "broker": BrokerConfig, "watcher": WatcherConfig, "server": BrokerProcessConfig,
            "load_manager": LoadManagerConfig, "load_manager.rebalancing": RebalancingConfig,
            "load_manager.failover": FailoverConfig, "load_manager.weighted_load": WeightedLoadConfig}
SECTIONS["object_store"] = ObjectStoreConfig


def test_config_md_matches_the_dataclasses():
    text = docs_sync.CONFIG_MD.read_text()
    assert text == docs_sync.render(text), (
        "docs/CONFIG.md drifted from the config dataclasses; run "
        "python -c \"import tiered.config.docs_sync as d; d.write()\"")


def test_every_field_of_every_section_is_a_documented_key():
    expected = set()
    for prefix, kind in SECTIONS.items():
        for f in dataclasses.fields(kind):
            name = f"{prefix}.{f.name}" if prefix else f.name
            if name in NOT_KEYS or (f"{name}" in SECTIONS):
                continue
            expected.add(name)
    assert expected == set(by_name()), "schema walk and dataclasses disagree"
    assert set(KEYS) == expected, (f"undocumented: {sorted(expected - set(KEYS))}; "
                                   f"documented but gone: {sorted(set(KEYS) - expected)}")
    for name, (meaning, nearest) in KEYS.items():
        assert meaning.strip() and nearest.strip(), name


def test_every_key_row_shows_the_dataclass_default():
    text = docs_sync.CONFIG_MD.read_text()
    for key in keys():
        row = f"| `{key.path[-1]}` | {docs_sync.format_default(key)} | `{key.env}` |"
        assert row in text, row


def test_one_unit_convention():
    for key in keys():
        last = key.path[-1]
        assert not last.endswith(("_ms", "_us", "_minutes", "_mb", "_mib", "_kb", "_seconds")), key.name
        if key.base_type is float and last.endswith("_s"):
            assert isinstance(key.default, (float, type(None))), key.name


def test_env_names_are_unique():
    assert len(by_env()) == len(keys())
