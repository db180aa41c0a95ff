"""What an embedder's type checker sees: the public entry points return concrete types,
not ``Any``. Never run; ``mypy`` (the ``files`` of ``[tool.mypy]``, run by
tests/test_typecheck.py) checks every ``assert_type`` below."""
from __future__ import annotations

from typing import assert_type

from tiered.lifecycle import BrokerHost, HostedTopic
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from tiered.read import Subscription, SubscriptionManager, TieredReader, create_reader


def embedder(host: BrokerHost, manager: SubscriptionManager, metadata: MetadataStore,
             objects: ObjectStore) -> None:
    hosted = assert_type(host.load("/default/t"), HostedTopic)
    assert_type(hosted.create_reader("earliest"), TieredReader)
    assert_type(hosted.subscribe("s"), Subscription)
    assert_type(manager.subscribe("s"), Subscription)
    assert_type(create_reader("/default/t", None, metadata, objects, 0), TieredReader)
