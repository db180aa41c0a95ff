"""Test doubles for metadata stores (fault injection); imported by tests, benchmarks and
the harness, never by production modules."""
from tiered.metadata.testing.faults import Fault, FaultPlan, FaultyMetadataStore

__all__ = ["Fault", "FaultPlan", "FaultyMetadataStore"]
