"""The uploader: archives durable WAL frames as dnb1 objects with fenced descriptors.

See docs/UPLOADER.md. Public API::

    Uploader, UploaderConfig, RetentionConfig, ArchiveRetentionConfig, UploaderPool, UploaderMetrics
    UploadError, OwnershipLost, ArchiveGap, ForeignDescriptor, CommitConflict, DrainTimeout, UploaderStopped
    collect_garbage, ArchiveRetention (archive retention, run by the owner's uploader)

It is the archive's only writer; how the archive sits in the stores (object keys, the
descriptor chain, the object format) lives in :mod:`tiered.archive`, which this package
and every reader share.
"""
from __future__ import annotations

from tiered._distribution import check_siblings

check_siblings(__file__, ("native", "wal", "tiered"))  # a shadowing module fails here, named

from uploader.archive_retention import ArchiveRetention
from uploader.config import ArchiveRetentionConfig, RetentionConfig, UploaderConfig
from uploader.errors import (
    ArchiveGap,
    CommitConflict,
    DrainTimeout,
    ForeignDescriptor,
    OwnershipLost,
    UploaderStopped,
    UploadError,
)
from uploader.gc import collect_garbage
from uploader.metrics import UploaderMetrics
from uploader.pool import UploaderPool
from uploader.uploader import Uploader

__all__ = [
    "ArchiveGap", "ArchiveRetention", "ArchiveRetentionConfig", "CommitConflict", "DrainTimeout", "ForeignDescriptor", "OwnershipLost", "RetentionConfig",
    "UploadError", "Uploader", "UploaderConfig", "UploaderMetrics", "UploaderPool", "UploaderStopped",
    "collect_garbage",
]  # fmt: skip
