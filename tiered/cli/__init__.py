"""The ``dnb`` command line (entry point :func:`tiered.cli.main.main`)."""
