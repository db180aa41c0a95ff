"""Tiered storage: metadata (etcd / SQLite) and object (S3 / local directory) stores."""
