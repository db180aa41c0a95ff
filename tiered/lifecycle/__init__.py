"""A broker hosting topics: take ownership, restore (load), seal (unload), fail over.

* ``host.py`` — :class:`BrokerHost` (one per broker process) and :class:`HostedTopic`:
  load/unload, produce with ``durable``/``archived`` acks, the ordered seal.
* ``ownership.py`` — owner records with epochs; every fenced write compares against the
  record this broker wrote, so a stale owner can never write again.
* ``restore.py`` — where offsets continue on load (sealed state, descriptors, progress).
* ``watcher.py`` — follows ``/cluster/brokers/<id>/`` assignments (load on PUT, seal on DELETE).
* ``config.py`` — :class:`BrokerConfig`.
"""
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.host import (
    BrokerHost,
    HostedTopic,
    LifecycleError,
    LoadError,
    ProduceTimeout,
    RestoreReport,
    RetiredWal,
    TopicNotHosted,
    TopicState,
    TopicUnloading,
    UnloadError,
)

__all__ = [
    "BrokerConfig", "BrokerHost", "HostedTopic", "LifecycleError", "LoadError", "ProduceTimeout",
    "RestoreReport", "RetiredWal", "TopicNotHosted", "TopicState", "TopicUnloading", "UnloadError",
]
