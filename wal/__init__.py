"""dnb-storage write-ahead log: durable, per-topic, group-committed, with tail readers.

Public API (see docs/WAL.md):
    WriteAheadLog.open(root_dir, topic, config=WalConfig(), initial_offset=None, fs=None,
                       metrics_registry=None)
    WalConfig, Message, SegmentInfo, TopicName, RealFs, and the errors below.

Consumers type their WAL parameters with the Protocols of ``wal.api`` (``Wal``,
``WalTailSource``, ``WalFrameSource``, ``WalOffsets``). Test doubles (the fault-injecting
in-memory file system ``FaultFs``) live in ``wal.testing``, which production code never
imports.
"""
from wal.api import Wal, WalFrameSource, WalOffsets, WalTailReader, WalTailSource
from wal.config import WalConfig
from wal.errors import (
    CorruptLog,
    InitialOffsetMismatch,
    InvalidTopicName,
    MessageTooLarge,
    OffsetBelowRetention,
    WalClosed,
    WalError,
    WalFailed,
    WalTimeout,
)
from wal.fs import FileSystem, RealFs
from wal.log import WriteAheadLog
from wal.message import Message
from wal.reader import WalReader
from wal.segment import SegmentInfo
from wal.topics import TopicName

__all__ = [
    "Wal", "WalTailSource", "WalFrameSource", "WalOffsets", "WalTailReader",
    "WriteAheadLog", "WalConfig", "Message", "WalReader", "SegmentInfo", "TopicName",
    "FileSystem", "RealFs", "WalError", "InvalidTopicName", "MessageTooLarge",
    "WalClosed", "WalFailed", "CorruptLog", "OffsetBelowRetention", "InitialOffsetMismatch",
    "WalTimeout",
]
