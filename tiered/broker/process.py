"""What ``dnb broker run`` runs: one long-lived broker process.

Start: open the stores, build the :class:`BrokerHost` (which registers the broker under
a lease with its advertised address and locks its WAL root), follow its assignments
(:class:`AssignmentWatcher`: load on assign, seal on unassign), serve the HTTP API.

SIGTERM (or SIGINT): stop taking new topics (the watcher stops), seal every hosted
topic (clients see 503 for a topic while it seals, then a redirect to its next owner),
deregister, exit 0. A second signal, or ``shutdown_timeout_s`` passing, abandons what
is left: topics stay owned and unsealed with their WALs on disk, exactly as after a
crash (this broker recovers them on restart; another fails them over once the lease
lapses); exit 1. Transitions are logged.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import replace
from typing import Any

from aiohttp import web

from tiered.broker.config import BrokerProcessConfig
from tiered.broker.server import BrokerServer
from tiered.cluster.metrics import LoadManagerMetrics
from tiered.cluster.reports import LoadReporter
from tiered.cluster.runtime import LoadManager
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig

log = logging.getLogger(__name__)


async def serve(broker_id: str, wal_root: str, metadata, objects, config: BrokerConfig,
                process: BrokerProcessConfig, ready: asyncio.Event | None = None,
                stop: asyncio.Event | None = None, watcher: WatcherConfig | None = None,
                load_report_interval_s: float | None = 30.0, load_manager: Any = None,
                load_manager_runtime: Any = None) -> int:
    """Run until ``stop`` is set or a termination signal arrives; returns the exit code.

    ``load_report_interval_s``: write this broker's load report (``/cluster/load/<id>``)
    this often (None: never). ``load_manager`` (a ``LoadManagerConfig``; None: not) runs a
    load-manager candidate in this process, with ``load_manager_runtime`` (a
    ``tiered.cluster.runtime.RuntimeConfig``; None: defaults)."""
    address = config.advertised_address or f"http://{process.listen_host}:{process.listen_port}"
    host = BrokerHost(broker_id, wal_root, metadata, objects, replace(config, advertised_address=address))
    stop = stop or asyncio.Event()
    signals = _install_signals(stop)
    watcher_config, watcher = watcher, None
    cluster_roles = _ClusterRoles(host, load_report_interval_s, load_manager, load_manager_runtime, process)
    runner = web.AppRunner(BrokerServer(host).app(), access_log=None)
    try:
        watcher = await AssignmentWatcher(host, watcher_config).start_async()
        await asyncio.to_thread(cluster_roles.start)
        await runner.setup()
        await web.TCPSite(runner, process.listen_host, process.listen_port).start()
        log.info("broker %s: serving on %s:%d, advertised as %s", broker_id, process.listen_host,
                 process.listen_port, address)
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("broker %s: stopping: no new topics; sealing %d hosted topic(s)", broker_id, len(host.topics()))
        stopping_watcher = watcher
        watcher = None

        async def stop_then_seal() -> None:
            await asyncio.to_thread(cluster_roles.stop)  # resign first: another leader takes over
            await stopping_watcher.stop_async()
            await host.close_async(timeout_s=process.shutdown_timeout_s)

        # The second signal is listened for from the first moment of the shutdown: any
        # step of it may be stuck (storage down, a busy thread pool).
        sealing = asyncio.create_task(stop_then_seal())
        abandon = asyncio.create_task(signals.second.wait())
        done, _ = await asyncio.wait({sealing, abandon}, return_when=asyncio.FIRST_COMPLETED)
        if sealing in done:
            abandon.cancel()
            sealing.result()
            log.info("broker %s: every topic sealed; deregistered; bye", broker_id)
            return 0
        log.error("broker %s: second signal: abandoning the remaining topics (recoverable, like a crash)",
                  broker_id)
        os._exit(1)  # the seal thread may be blocked on storage; what it left is recoverable
    finally:
        signals.restore()
        await asyncio.to_thread(cluster_roles.stop)
        if watcher is not None:
            await watcher.stop_async()
        await runner.cleanup()
        if not host.closed:
            await host.close_async(unload=False)
    return 1


class _ClusterRoles:
    """The load reporter and (with ``--load-manager``) a load-manager candidate that run
    beside the broker. The manager resigns on stop, so another candidate takes over
    at once instead of after its lease lapses."""

    def __init__(self, host: BrokerHost, load_report_interval_s: float | None, load_manager: Any,
                 load_manager_runtime: Any, process: BrokerProcessConfig | None = None) -> None:
        self.host = host
        self.load_report_interval_s = load_report_interval_s
        self.process = process or BrokerProcessConfig()
        self.load_manager = load_manager
        self.load_manager_runtime = load_manager_runtime
        self.reporter = None
        self.manager = None

    def start(self) -> None:
        if self.load_report_interval_s is not None:
            self.reporter = LoadReporter(self.host, self.load_report_interval_s, nic_bps=self.process.nic_bps,
                                         disk_bps=self.process.disk_bps).start()
        if self.load_manager is not None:
            # The host's registry: the load manager's dnb_* metrics appear on this broker's /metrics.
            self.manager = LoadManager(self.host.metadata, self.host.broker_id, self.load_manager,
                                       self.load_manager_runtime,
                                       metrics=LoadManagerMetrics(self.host.metrics_registry)).start()
            log.info("broker %s: load-manager candidate started", self.host.broker_id)

    def stop(self) -> None:
        manager, self.manager = self.manager, None
        if manager is not None:
            manager.stop(resign=True)
        reporter, self.reporter = self.reporter, None
        if reporter is not None:
            reporter.stop()


class _Signals:
    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.second = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        self.installed: list[int] = []

    def __call__(self) -> None:
        if self.stop.is_set():
            self.second.set()
        else:
            self.stop.set()

    def restore(self) -> None:
        for signum in self.installed:
            self.loop.remove_signal_handler(signum)


def _install_signals(stop: asyncio.Event) -> _Signals:
    signals = _Signals(stop)
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            signals.loop.add_signal_handler(signum, signals)
            signals.installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (tests): stop through the event instead
    return signals
