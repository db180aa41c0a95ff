"""The archive: how archived data sits in the stores, in one place.

A topic's archive is a chain of dnb1 objects in the object store, each named by one
descriptor in the metadata store. Everything that knows that layout lives here, on top of
the stores (``tiered.metadata``, ``tiered.objects``) and the format (``native``):

* :mod:`tiered.archive.naming` — object keys, built and parsed (one pattern);
* :mod:`tiered.archive.chain` — :class:`DescriptorChain`, the one pager over a topic's
  descriptors (first, last, tip, covering a range, every one);
* :mod:`tiered.archive.fetch` — one object's bytes: the one seam to the dnb1 format,
  every read held to the descriptor that names the object (size, footer and block CRC32C).

Users: the uploader (``uploader/``, the archive's only writer) names, encodes and commits
objects; the cloud reader (``tiered/read/cloud.py``), the tiered reader and subscriptions
read the chain and the objects; restore (``tiered/lifecycle/restore.py``) checks the
chain; Spark (``tiered/spark/``) plans and reads objects; verify, gc and the other tools
(``tiered/tools/``) check and list them. Descriptor *metadata* keys and records stay in
``tiered.metadata.keys`` with every other metadata key.
"""
from __future__ import annotations

from tiered.archive.chain import ChainTip, DescriptorChain, last_committed_offset, list_descriptors
from tiered.archive.fetch import ObjectMismatch, ObjectPin
from tiered.archive.naming import descriptor_object_key, object_key

__all__ = [
    "ChainTip", "DescriptorChain", "ObjectMismatch", "ObjectPin", "descriptor_object_key", "last_committed_offset",
    "list_descriptors", "object_key",
]  # fmt: skip
