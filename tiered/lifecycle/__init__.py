"""A broker hosting topics: take ownership, restore (load), seal (unload), fail over.

* ``host.py`` — :class:`BrokerHost` (one per broker process), the composition root:
  builds each topic's WAL, uploader and subscriptions and runs load and unload.
* ``hosted.py`` — :class:`HostedTopic`: produce with ``durable``/``archived`` acks,
  fencing, readers, the published durable tip.
* ``seal.py`` — the ordered unload (seal) of a hosted topic.
* ``wal_root.py`` — the broker's WAL root on disk: its lock, its broker id, the
  ``.owner`` marker of each WAL.
* ``retire.py`` — stale local WALs: deleted when archived, else quarantined, the loss
  recorded first.
* ``losses.py`` — the ``LostRange`` records every renumbering writes.
* ``ownership.py`` — owner records with epochs; every fenced write compares against the
  record this broker wrote, so a stale owner can never write again.
* ``restore.py`` — where offsets continue on load (sealed state, descriptors, progress).
* ``watcher.py`` — follows ``/cluster/brokers/<id>/`` assignments (load on PUT, seal on DELETE).
* ``errors.py``, ``steps.py`` — the lifecycle's errors; how its sequences run named steps.
* ``config.py`` — :class:`BrokerConfig`.
"""
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.errors import (
    LifecycleError,
    LoadError,
    LocalWalUnreadable,
    ProduceTimeout,
    TopicNotHosted,
    TopicUnloading,
    UnloadError,
    WalRootOwnedByAnotherBroker,
)
from tiered.lifecycle.host import BrokerHost
from tiered.lifecycle.hosted import HostedTopic, RestoreReport, TopicState
from tiered.lifecycle.losses import RetiredWal

__all__ = [
    "BrokerConfig", "BrokerHost", "HostedTopic", "LifecycleError", "LoadError", "LocalWalUnreadable",
    "ProduceTimeout", "RestoreReport", "RetiredWal", "TopicNotHosted", "TopicState", "TopicUnloading",
    "UnloadError", "WalRootOwnedByAnotherBroker",
]
