"""The shells: thin command-line and test-driving layers over the library.

- ``cli/``      the ``dnb`` command (each command a few library calls plus output)
- ``harness/``  the randomized move/failover harness (``dnb harness``)
- ``demo.py``   ``dnb demo``: a self-contained run on the embedded stores
- ``verify.py`` ``dnb verify``: checks a topic's archive, metadata and local WAL against the guarantees

Nothing below ``tiered/tools/`` is imported by the library itself.
"""
