"""The ``dnb broker`` process and its client.

* ``server.py`` — :class:`BrokerServer`, the HTTP API (aiohttp) around one
  :class:`~tiered.lifecycle.BrokerHost`: produce, read, ack; 307 to the owner, 503 while
  a topic moves; ``/metrics``, ``/healthz``, ``/topics``.
* ``process.py`` — :func:`run_broker`, what ``dnb broker run`` runs: register under a
  lease, follow assignments, serve HTTP, seal everything on SIGTERM.
* ``client.py`` — :class:`BrokerClient` (asyncio) and its blocking twin: look up the
  owner, follow redirects, retry 503 with back-off, resume reads at their own position.
"""
