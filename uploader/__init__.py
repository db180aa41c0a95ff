"""The uploader: archives durable WAL frames as dnb1 objects with fenced descriptors.

See docs/UPLOADER.md. Public API::

    Uploader, UploaderConfig, RetentionConfig, UploaderPool, UploaderMetrics
    UploadError, OwnershipLost, ArchiveGap, CommitConflict, DrainTimeout, UploaderStopped
    list_descriptors, last_committed_offset, find_orphans, collect_garbage, Orphan
"""
from __future__ import annotations

from uploader.commit import last_committed_offset, list_descriptors
from uploader.config import RetentionConfig, UploaderConfig
from uploader.errors import (
    ArchiveGap,
    CommitConflict,
    DrainTimeout,
    OwnershipLost,
    UploaderStopped,
    UploadError,
)
from uploader.gc import Orphan, collect_garbage, find_orphans
from uploader.metrics import UploaderMetrics
from uploader.pool import UploaderPool
from uploader.uploader import Uploader

__all__ = [
    "ArchiveGap", "CommitConflict", "DrainTimeout", "Orphan", "OwnershipLost", "RetentionConfig",
    "UploadError", "Uploader", "UploaderConfig", "UploaderMetrics", "UploaderPool", "UploaderStopped",
    "collect_garbage", "find_orphans", "last_committed_offset", "list_descriptors",
]  # fmt: skip
