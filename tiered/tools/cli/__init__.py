"""The ``dnb`` command line (entry point :func:`tiered.tools.cli.main.main`)."""
