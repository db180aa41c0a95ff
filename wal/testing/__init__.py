"""Test doubles for the WAL's layers; imported by tests, benchmarks and the harness,
never by production modules."""
from wal.testing.faultfs import PAGE_BYTES, FaultFs

__all__ = ["FaultFs", "PAGE_BYTES"]
