"""The SQLite store's leases run on the machine's boot clock, not the wall clock.

A wall-clock step forward (NTP, a VM clock correction) used to expire a live broker's
session lease in the embedded store, so another broker could take its topics over while
it kept acknowledging. And a lease can outlive
nothing across a reboot: its holders died with the boot, so it is revoked at open.
"""
from __future__ import annotations

import time

from tiered.metadata import sqlite as sqlite_store
from tiered.metadata.sqlite import SqliteMetadataStore


def test_a_wall_clock_step_forward_does_not_expire_a_live_lease(tmp_path, monkeypatch) -> None:
    store = SqliteMetadataStore(tmp_path / "m.db")
    try:
        lease = store.grant_lease(30.0)
        store.put("/cluster/registered/A", b"alive", lease_id=lease.id)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600.0)  # the clock jumps an hour
        assert store.get("/cluster/registered/A") is not None
        store.refresh_lease(lease.id)
        assert store.get("/cluster/registered/A") is not None
    finally:
        store.close()


def test_leases_stamped_by_another_boot_are_re_armed_for_one_ttl_not_revoked(tmp_path, monkeypatch) -> None:
    """Their deadlines were on another boot's clock. Revoking them at open took live
    brokers' leases whenever a process read another boot id (an unreadable /proc gives
    "unknown"): re-armed for one TTL instead, they lapse only if
    nobody refreshes them."""
    path = tmp_path / "m.db"
    store = SqliteMetadataStore(path)
    lease = store.grant_lease(30.0)
    store.put("/cluster/registered/A", b"alive", lease_id=lease.id)
    store.put("/storage/plain", b"kept")
    store.close()
    monkeypatch.setattr(sqlite_store, "_boot_id", lambda: "another-boot")
    again = SqliteMetadataStore(path)
    try:
        assert again.get("/cluster/registered/A") is not None, "a live holder's lease was taken"
        now = sqlite_store.lease_clock()
        monkeypatch.setattr(sqlite_store, "lease_clock", lambda: now + 31.0)  # one TTL, no refresh
        assert again.get("/cluster/registered/A") is None
        assert again.get("/storage/plain") is not None
    finally:
        again.close()


def test_a_suspend_makes_the_brokers_lease_uncertain(tmp_path, monkeypatch) -> None:
    """A suspend stops the monotonic clock but not the store's lease countdown (nor etcd's,
    on another machine): the broker measures its lease on the boot clock, which counts the
    suspend."""
    from tiered.lifecycle import ownership
    from tiered.lifecycle.ownership import BrokerSession

    store = SqliteMetadataStore(tmp_path / "m.db")
    session = BrokerSession(store, "A", ttl_s=30.0).start()
    try:
        assert session.remaining_s() > 20.0
        now = ownership.lease_clock()
        monotonic = time.monotonic()
        monkeypatch.setattr(ownership, "lease_clock", lambda: now + 60.0)  # suspended for a minute
        assert time.monotonic() - monotonic < 60.0  # the monotonic clock did not see it
        assert session.remaining_s() < 0
    finally:
        monkeypatch.undo()
        session.stop(revoke=True)
        store.close()
