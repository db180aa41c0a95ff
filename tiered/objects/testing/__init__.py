"""Test doubles for object stores (fault injection); imported by tests, benchmarks and
the harness, never by production modules."""
from tiered.objects.testing.faults import FaultyObjectStore

__all__ = ["FaultyObjectStore"]
