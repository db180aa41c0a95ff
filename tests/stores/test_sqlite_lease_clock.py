"""The SQLite store's leases run on the machine's boot clock, not the wall clock.

A wall-clock step forward (NTP, a VM clock correction) used to expire a live broker's
session lease in the embedded store, so another broker could take its topics over while
it kept acknowledging (found by the issue-10 attack pass). And a lease can outlive
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


def test_leases_granted_under_an_earlier_boot_are_revoked_at_open(tmp_path, monkeypatch) -> None:
    path = tmp_path / "m.db"
    store = SqliteMetadataStore(path)
    lease = store.grant_lease(3600.0)
    store.put("/cluster/registered/A", b"alive", lease_id=lease.id)
    store.put("/storage/plain", b"kept")
    store.close()
    monkeypatch.setattr(sqlite_store, "_boot_id", lambda: "another-boot")
    again = SqliteMetadataStore(path)
    try:
        assert again.get("/cluster/registered/A") is None
        assert again.get("/storage/plain") is not None
    finally:
        again.close()
    same_boot = SqliteMetadataStore(path)  # a second process of the same boot revokes nothing new
    try:
        assert same_boot.get("/storage/plain") is not None
    finally:
        same_boot.close()
