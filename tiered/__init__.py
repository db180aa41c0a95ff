"""Tiered storage and the cluster around the WAL, one storey per folder (lowest first).

Foundation
  ``errors.py``    the storage error tree (its root, ``DnbError``, is in ``native/errors.py``)
  ``metadata/``    the metadata store interface; SQLite (embedded) and etcd backends; ``keys.py``
                   builds and parses every metadata key and record
  ``objects/``     the object store interface; local-directory (embedded) and S3 backends
  ``archive/``     how archived data sits in those stores: object naming, the descriptor chain,
                   object fetches checked against their descriptor
Domain
  ``read/``        the consumer side: cloud → WAL → live reader, subscription cursors
  ``lifecycle/``   a broker hosting topics: ownership, restore (load), seal (unload), failover;
                   the composition root that wires the WAL, the uploader and the readers
  ``cluster/``     the load manager: decisions, leader election, load reports, the runtime
Services and integrations
  ``broker/``      the broker process: HTTP API over ``lifecycle``, and its client
  ``spark/``       a PySpark data source over ``archive/``
  ``config/``      one configuration composed of every layer's section
Shells
  ``tools/``       ``dnb`` CLI, randomized harness, demo, verify: thin over the library

``docs/ARCHITECTURE.md`` draws the data paths through these folders.
"""
from tiered._distribution import check_siblings

# A user's own module named like a sibling package must fail here, naming itself, not
# deep inside an import that needed the real package.
check_siblings(__file__, ("native", "wal", "uploader"))
