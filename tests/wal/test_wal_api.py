"""The Protocols of wal/api.py match the real log and the in-memory doubles tests use for it.

Consumers type against the Protocols, so a member the log lacks, or a signature that
drifted from it, would go unnoticed until a consumer called it: each member's presence and
parameter names are checked here, on the log and on each double for the slice it stands in for.
"""
from __future__ import annotations

import inspect

import pytest

from tests.tiered.helpers_read import MemoryWal
from tests.uploader.memwal import MemWal
from wal import WalConfig, WriteAheadLog
from wal.api import Wal, WalFrameSource, WalOffsets, WalTailReader, WalTailSource

_PROTOCOLS = (WalOffsets, WalTailReader, WalTailSource, WalFrameSource, Wal)


def _members(protocol: type) -> dict[str, object]:
    """Every member the Protocol declares (its own and its bases'), by name."""
    members: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass in _PROTOCOLS:
            members.update({name: value for name, value in vars(klass).items()
                            if not name.startswith("_") or name in {"__iter__", "__next__", "__aiter__",
                                                                     "__anext__"}})
    return members


def _parameters(function: object) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _check(implementation: object, protocol: type, signatures: bool = True) -> None:
    assert isinstance(implementation, protocol)
    for name, declared in _members(protocol).items():
        assert hasattr(implementation, name), f"{type(implementation).__name__} lacks {name}"
        if signatures and callable(declared) and not isinstance(declared, property):
            actual = getattr(type(implementation), name)
            assert _parameters(actual) == _parameters(declared), (
                f"{type(implementation).__name__}.{name}{inspect.signature(actual)} differs from "
                f"{protocol.__name__}.{name}{inspect.signature(declared)}")  # type: ignore[arg-type]


@pytest.fixture
def log(tmp_path):
    with WriteAheadLog.open(str(tmp_path), "ns/api", WalConfig()) as wal:
        yield wal


def test_the_log_satisfies_every_protocol(log):
    for protocol in (WalOffsets, WalTailSource, WalFrameSource, Wal):
        _check(log, protocol)
    log.append(b"x")
    with log.reader(0) as reader:
        _check(reader, WalTailReader)


def test_the_test_doubles_satisfy_the_protocol_their_consumer_types_against():
    # MemoryWal stands in for the log under the tiered reader; MemWal under the uploader.
    # Their signatures are looser (test helpers), so only presence is checked.
    _check(MemoryWal(), WalTailSource, signatures=False)
    _check(MemoryWal().reader(0), WalTailReader, signatures=False)
    _check(MemWal(), WalOffsets, signatures=False)
    _check(MemWal(), WalFrameSource, signatures=False)
