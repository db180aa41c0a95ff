"""Unload: the ordered seal of a hosted topic.

In order: refuse appends → flush + fsync the WAL → flush cursors → drain the uploader
to exactly the WAL tip → refuse acks and flush cursors again → write ``sealed: true``
and release ownership in ONE fenced transaction → only then (:func:`cleanup`) delete
the local WAL. A failed step raises :class:`~tiered.lifecycle.errors.UnloadError`
naming it, leaves the WAL and the topic unsealed, and unloading again resumes.
"""
from __future__ import annotations


from tiered.errors import StorageError
from tiered.metadata import keys
from tiered.metadata.base import Delete, MetadataStore, Put
from tiered.metadata.keys import progress_key
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.errors import UnloadError
from tiered.lifecycle.hosted import HostedTopic, TopicState
from tiered.lifecycle.ownership import OwnerRecord, OwnershipLostError, OwnerToken, release_ops
from tiered.lifecycle.restore import sealed_state
from tiered.lifecycle.steps import quietly, run_step
from wal.api import Wal


def seal(hosted: HostedTopic, metadata: MetadataStore, config: BrokerConfig) -> int | None:
    """Seal ``hosted`` (see the module docstring); returns its last committed offset."""
    if hosted.state is TopicState.SEALED:
        return hosted.last_committed_offset
    if hosted.state is TopicState.CLOSED:
        raise UnloadError(hosted.topic, "unload", "topic is closed on this broker")
    topic, cfg = hosted.topic, config
    hosted.refuse_appends()
    # A takeover this copy has not noticed yet replaced its unarchived tail: learn it before
    # the readers go, so they are told where the new owner continues (HistoryDiverged).
    quietly(hosted.check_ownership)
    hosted.move_readers_away()
    run_step(topic, "flush WAL", UnloadError, lambda: _flush_wal(hosted.wal, cfg.flush_timeout_s))
    run_step(topic, "flush subscription cursors", UnloadError, hosted.subscriptions.flush_all)
    # The drain can take long; if this broker dies in it, the next owner reports
    # the unarchived tail from this record, so publish the now-flushed tip first.
    quietly(hosted.publish_progress)
    last = run_step(topic, "drain uploader", UnloadError, lambda: drain(hosted, config))
    # Consumers keep acking during the drain; refuse further acks and write what
    # moved, or those acks would be dropped and the next owner re-serve them. (A
    # retried unload writes any cursor this left unwritten at the flush above.)
    run_step(topic, "flush subscription cursors", UnloadError,
             lambda: hosted.subscriptions.close(flush=True))
    run_step(topic, "write sealed state", UnloadError, lambda: write_seal(hosted, metadata, last))
    hosted.last_committed_offset = last
    hosted.state = TopicState.SEALED
    return last


def drain(hosted: HostedTopic, config: BrokerConfig) -> int | None:
    """Drain the uploader; the offset it archived through, which must be the WAL tip."""
    last = hosted.uploader.drain(config.uploader.drain_timeout_s)
    tip = hosted.wal.next_offset - 1
    expected = None if tip < 0 else tip
    # Seal must name exactly the last archived offset, which after a drain is the
    # WAL tip; anything else would let the next owner reuse or skip offsets.
    if last != expected:
        raise RuntimeError(f"uploader drained through {last} but the WAL tip is {expected}")
    return last


def write_seal(hosted: HostedTopic, metadata: MetadataStore, last: int | None) -> None:
    """The one fenced txn: sealed state at ``last``, owner released, progress deleted."""
    token = hosted.token
    ops = [Put(keys.state_key(token.topic), sealed_state(token, last).to_json()),
           *release_ops(token), Delete(progress_key(token.topic))]
    try:
        result = metadata.txn(token.fencing, ops)
    except StorageError:
        # The outcome of a timed-out txn is unknown: it may have landed.
        if seal_landed(metadata, token, last):
            return
        raise
    if not result.succeeded and not seal_landed(metadata, token, last):
        raise OwnershipLostError(token.topic, "write sealed state")


def seal_landed(metadata: MetadataStore, token: OwnerToken, last: int | None) -> bool:
    """A retried seal whose earlier attempt did land is a success, not a fencing error."""
    kv = metadata.get(token.key)
    state_kv = metadata.get(keys.state_key(token.topic))
    if kv is None or state_kv is None:
        return False
    owner = OwnerRecord.decode(kv.key, kv.value)
    state = keys.SealedState.from_json(state_kv.key, state_kv.value)
    return (owner.broker_id == token.broker_id and owner.epoch == token.epoch and owner.holder is None
            and state.sealed and state.broker_id == token.broker_id and state.last_committed_offset == last)


def cleanup(hosted: HostedTopic, config: BrokerConfig) -> None:
    """After the seal landed: stop the uploader, close subscriptions, delete the WAL."""
    topic = hosted.topic
    run_step(topic, "stop uploader", UnloadError, lambda: _stop_uploader(hosted, config.close_timeout_s))
    run_step(topic, "close subscriptions", UnloadError, lambda: hosted.subscriptions.close(flush=False))
    run_step(topic, "delete local WAL", UnloadError, lambda: _close_and_delete(hosted.wal))
    hosted.state = TopicState.CLOSED


def _stop_uploader(hosted: HostedTopic, timeout_s: float) -> None:
    """Deleting the WAL needs every background pass of the topic ended (the upload pool
    may be running one): a pass still running after ``timeout_s`` fails the step, the
    WAL is kept, and unloading again resumes here."""
    if not hosted.uploader.stop(timeout_s):
        raise TimeoutError(f"a background upload pass did not end within {timeout_s}s; the local WAL is kept")


def _flush_wal(wal: Wal, timeout_s: float) -> None:
    wal.flush(timeout_s)  # raises WalTimeout (a TimeoutError) when not fsynced within timeout_s


def _close_and_delete(wal: Wal) -> None:
    wal.close()
    wal.delete()
