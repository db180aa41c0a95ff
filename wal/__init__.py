"""dnb-storage write-ahead log: durable, per-topic, group-committed, with tail readers.

Public API (see docs/WAL.md):
    WriteAheadLog.open(root_dir, topic, config=WalConfig(), initial_offset=None, fs=None,
                       metrics_registry=None)
    WalConfig, Message, SegmentInfo, TopicName, RealFs, FaultFs, and the errors below.
"""
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
from wal.fs import FaultFs, FileSystem, RealFs
from wal.log import WriteAheadLog
from wal.message import Message
from wal.reader import WalReader
from wal.segment import SegmentInfo
from wal.topics import TopicName

__all__ = [
    "WriteAheadLog", "WalConfig", "Message", "WalReader", "SegmentInfo", "TopicName",
    "FileSystem", "RealFs", "FaultFs", "WalError", "InvalidTopicName", "MessageTooLarge",
    "WalClosed", "WalFailed", "CorruptLog", "OffsetBelowRetention", "InitialOffsetMismatch",
    "WalTimeout",
]
