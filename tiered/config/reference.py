"""What each configuration key means, and its nearest Kafka / Pulsar setting.

The one hand-written part of docs/CONFIG.md: keys, defaults, units and env names are
read off the dataclasses (:mod:`tiered.config.schema`), these descriptions are joined to
them, and ``tests/config/test_docs.py`` fails when a key has no entry here, an entry
names no key, or docs/CONFIG.md differs from what :mod:`tiered.config.docs_sync` renders.
"""
from __future__ import annotations

NONE = "—"

#: key -> (meaning, nearest Kafka / Pulsar / BookKeeper name)
KEYS: dict[str, tuple[str, str]] = {
    # -- top level: the CLI's global options ------------------------------------------
    "broker_id": ("This broker's id (1-128 of `[A-Za-z0-9._-]`): names its registration, assignments and "
                  "owner records.", "Kafka `node.id` / `broker.id`"),
    "data_dir": ("Directory for this broker's local state; the default parent of `wal_dir`, the SQLite "
                 "metadata file and the local object directory. Relative paths are relative to the working "
                 "directory.", "Kafka `log.dirs` (parent)"),
    "wal_dir": ("Root of the per-topic WALs. Unset: `<data_dir>/wal`.",
                "Kafka `log.dirs`; BookKeeper `journalDirectories`"),
    "metadata": ("Metadata store URL: `sqlite:///path/metadata.db` or `etcd://host:port[,host:port][/root]`. "
                 "Unset: `sqlite:///<data_dir>/metadata.db`.",
                 "Pulsar `metadataStoreUrl`; Kafka `controller.quorum.voters`"),
    "objects": ("Object store URL: `file:///dir` or `s3://bucket/prefix[?endpoint=…]`. Unset: "
                "`file://<data_dir>/objects`.",
                "Kafka `remote.log.storage.manager.class.name` + its RSM config; Pulsar "
                "`managedLedgerOffloadDriver` + `managedLedgerOffloadBucket`"),
    # -- wal -----------------------------------------------------------------------------
    "wal.fsync_batch_bytes": ("Pending bytes at which an append wakes a writer that is not parked. There is "
                              "no fsync interval: every durable ack waits for its fsync, and rounds form by "
                              "themselves while the previous fsync runs (group commit without a timer).",
                              "BookKeeper `journalBufferedWritesThreshold`; Kafka `log.flush.interval.messages`"
                              " / `log.flush.interval.ms` (Kafka leaves flushing to the OS by default)"),
    "wal.commit_group": ("A broker host opens every topic's WAL of its root in one commit group: one writer "
                         "thread and one sync per round for all topics (throughput independent of the "
                         "topic count; a sync error fails every topic closed). `false`: one writer thread "
                         "and one fdatasync per topic per round (docs/WAL.md).",
                         "BookKeeper `journalDirectories` (one journal per disk for all ledgers)"),
    "wal.group_sync": ("How the commit group makes a round durable. `journal`: the round is also appended to "
                       "the root's shared journal and one fdatasync of it makes the round durable; segment "
                       "files are synced lazily at journal checkpoints and replayed from the journal after a "
                       "crash. `syncfs`: one `syncfs(2)` of the root's file system per round (no second copy, "
                       "but unrelated dirty data on that file system is flushed too: give the WAL its own "
                       "volume).", "BookKeeper journal + entry log (`journalDirectories`, `ledgerDirectories`)"),
    "wal.journal_file_bytes": ("Size at which the journal moves to its next file. Files are recycled once a "
                               "checkpoint passed them, so in steady state rounds overwrite old bytes and a "
                               "round's fdatasync has no size change to commit.",
                               "BookKeeper `journalMaxSizeMB`, `journalPreAllocSizeMB`"),
    "wal.journal_checkpoint_bytes": ("A journal checkpoint (sync the segment files written since the last one, "
                                     "then recycle the journal behind them) starts after this many journal bytes. "
                                     "Bounds how much a crash leaves to replay.",
                                     "BookKeeper `flushInterval` (entry log flush)"),
    "wal.journal_files_max": ("At most this many journal files past the last checkpoint: beyond, a round waits for "
                              "a checkpoint first (backpressure), so the journal's disk use and the replay after a "
                              "crash stay near `journal_files_max * journal_file_bytes`.",
                              "BookKeeper `maxJournalSizeMB` / `maxBackupJournals`"),
    "wal.journal_checkpoint_interval_s": ("... or after this long, whichever comes first, if anything was "
                                          "written since the last checkpoint.",
                                          "BookKeeper `flushInterval`"),
    "wal.journal_checkpoint_syncfs_min_files": ("A checkpoint syncing at least this many segment files does it "
                                                "with one syncfs of the root's file system (where that reaches "
                                                "them all, on Linux 5.17 and later) instead of one fdatasync, one "
                                                "device flush, each. A syncfs also writes back other programs' "
                                                "dirty data on that file system: on one shared with a heavy "
                                                "writer, set this above the topic count.",
                                                "none (BookKeeper syncs each entry log file)"),
    "wal.segment_bytes_max": ("Cut a new segment once the active one passes this size, less up to 10 % that "
                              "differs from segment to segment (so topics fed alike do not all cut theirs in one "
                              "commit round); checked before each write batch, so a segment may exceed it by one "
                              "batch.",
                              "Kafka `log.segment.bytes` (`segment.bytes`); Pulsar "
                              "`managedLedgerMaxSizePerLedgerMbytes`"),
    "wal.segment_age_max_s": ("Cut a new segment once the active one is this old, less up to 10 % that differs "
                              "from segment to segment (so topics opened together do not all cut theirs in "
                              "one commit round).",
                              "Kafka `log.roll.ms` (`segment.ms`); Pulsar "
                              "`managedLedgerMaxLedgerRolloverTimeMinutes`"),
    "wal.cache_messages_max": ("Recent durable messages of one topic kept in memory for tail readers.",
                               "none (Pulsar bounds its cache by size only)"),
    "wal.cache_bytes_max": ("Byte bound of one topic's cache.",
                            "none (Pulsar's is broker-wide: `managedLedgerCacheSizeMB`)"),
    "wal.cache_group_bytes_max": ("Byte bound of all topics' caches in one WAL root together (a broker "
                                  "host's commit group, or its per-topic writers); past it the largest caches give up their oldest "
                                  "frames first, and readers read those from the segment files.",
                                  "Pulsar `managedLedgerCacheSizeMB`"),
    "wal.max_message_bytes": ("Largest encoded record (key + attributes + payload + record header) "
                              "accepted; larger appends fail without using an offset.",
                              "Kafka `message.max.bytes` (`max.message.bytes`); Pulsar `maxMessageSize`"),
    "wal.pending_bytes_max": ("Appended-but-unwritten bytes of one topic above which appends block (backpressure, so a "
                              "stalled disk cannot eat all memory).",
                              "Kafka producer `buffer.memory` (per producer); Pulsar's is broker-wide"),
    "wal.pending_group_bytes_max": ("The same bound for all topics of one WAL root together (a broker host's "
                                    "commit group, or its per-topic writers): an append to any of them waits while they hold this much.",
                                    "Pulsar `maxMessagePublishBufferSizeInMB` (broker-wide)"),
    "wal.append_timeout_s": ("How long a blocked append waits for room before it fails.",
                             "Kafka producer `max.block.ms`"),
    "wal.read_chunk_bytes": ("Bytes a reader pulls from a segment file per read.",
                             "Kafka `max.partition.fetch.bytes` (nearest)"),
    "wal.index_interval_bytes": ("One sparse index entry (offset → file position) per this many segment bytes.",
                                 "Kafka `log.index.interval.bytes` (`index.interval.bytes`)"),
    "wal.close_timeout_s": ("Bound on closing a WAL (its writer drains what is pending).", NONE),
    # -- uploader ------------------------------------------------------------------------
    "uploader.interval_s": ("An upload pass runs at least this often per hosted topic.",
                            "Kafka `remote.log.manager.task.interval.ms`; Pulsar "
                            "`managedLedgerOffloadThresholdInSeconds`"),
    "uploader.upload_bytes_threshold": ("A pass starts early once this many durable bytes are not archived.",
                                        "Pulsar `managedLedgerOffloadAutoTriggerSizeThresholdBytes`"),
    "uploader.object_bytes_max": ("An archive object holds at most this many bytes of frames (a single "
                                  "larger frame gets an object of its own).",
                                  "Kafka `log.segment.bytes` (Kafka tiers whole segments)"),
    "uploader.object_target_bytes": ("A background pass uploads objects of this many bytes of frames (the rest "
                                     "waits for `object_age_max_s`); archived waiters, seals and explicit uploads "
                                     "upload everything at once.",
                                     "Kafka `log.segment.bytes` (only rolled segments are tiered); Pulsar "
                                     "`managedLedgerOffloadAutoTriggerSizeThresholdBytes`"),
    "uploader.object_age_max_s": ("... or sooner, once the oldest un-archived durable frame is this old: the "
                                  "longest a durable-only message waits for the archive at a low rate.",
                                  "Kafka `log.roll.ms` (`segment.ms`) bounds the same wait; Pulsar "
                                  "`managedLedgerOffloadThresholdInSeconds`"),
    "uploader.block_bytes": ("Size of one (compressed) block inside an object: the unit of a ranged read.",
                             "Pulsar `managedLedgerOffloadMaxBlockSizeInBytes`"),
    "uploader.compression": ("Block compression: `zstd` or `none`.",
                             "Kafka `compression.type`; Pulsar `compressionType`"),
    "uploader.zstd_level": ("zstd level, 1-22.", "Kafka `compression.zstd.level`"),
    "uploader.drain_timeout_s": ("The one drain bound: a seal's drain (archive up to the WAL tip) and each "
                                 "upload pass give up after it (the unload fails with the WAL intact and "
                                 "can be retried).", NONE),
    "uploader.retry_attempts_max": ("Attempts of one pass on retryable storage errors.",
                                    "Kafka `retries` (producer)"),
    "uploader.retry_backoff_s": ("First back-off between those attempts (doubles each time).",
                                 "Kafka `retry.backoff.ms`"),
    "uploader.retry_backoff_max_s": ("Largest back-off.", "Kafka `retry.backoff.max.ms`"),
    "uploader.conflict_retries_max": ("Re-reads of the descriptor chain per pass after a contiguity "
                                      "conflict.", NONE),
    "uploader.poll_interval_s": ("How often the background worker re-checks the byte threshold between "
                                 "passes.", NONE),
    "uploader.retention.age_max_s": ("Delete local WAL segments that are fully archived and older than this. "
                                     "Unset: no age limit.",
                                     "Kafka `log.local.retention.ms` (`local.retention.ms`)"),
    "uploader.retention.bytes_max": ("Delete fully archived local WAL segments while the WAL is bigger than "
                                     "this. Unset: no size limit.",
                                     "Kafka `log.local.retention.bytes` (`local.retention.bytes`)"),
    "uploader.archive_retention.age_max_s": ("Archive retention by age, per topic: the owner removes archived "
                                             "objects committed longer ago than this (oldest first, never the "
                                             "last one; readers below the new start get "
                                             "`OffsetBelowRetention`). Unset: keep forever.",
                                             "Kafka `retention.ms` (`log.retention.ms`); Pulsar "
                                             "`defaultRetentionTimeInMinutes`"),
    "uploader.archive_retention.bytes_max": ("Archive retention by size, per topic: the owner removes the oldest "
                                             "archived objects while the topic's retained objects total more "
                                             "than this (never the last one). Unset: no size limit.",
                                             "Kafka `retention.bytes` (`log.retention.bytes`); Pulsar "
                                             "`defaultRetentionSizeInMB`"),
    "uploader.archive_retention.check_interval_s": ("How often the owner's uploader applies archive retention "
                                                    "(one paged read of the topic's descriptors each time).",
                                                    "Kafka `log.retention.check.interval.ms`"),
    # -- broker (lifecycle) --------------------------------------------------------------
    "broker.session_ttl_s": ("Lease of this broker's registration: other brokers take its topics over only "
                             "after it lapses.", "Kafka `broker.session.timeout.ms`; Pulsar "
                             "`metadataStoreSessionTimeoutMillis`"),
    "broker.register_session": ("Register under a lease (turn off only to embed without failover or "
                                "assignments).", NONE),
    "broker.advertised_address": ("URL clients reach this broker at, written into its registration for "
                                  "lookup and redirects. Unset: `dnb broker run` advertises "
                                  "`http://<listen_host>:<listen_port>`.",
                                  "Kafka `advertised.listeners`; Pulsar `advertisedAddress`"),
    "broker.ack_lease_margin_s": ("A durable ack needs more than this much of the session lease left, so a "
                                  "paused or cut-off broker stops acking well before its topics can move. "
                                  "Unset: `session_ttl_s / 3`.", NONE),
    "broker.progress_interval_s": ("How often each topic's durable tip is published (a failover reports the "
                                   "unarchived tail from it).", NONE),
    "broker.produce_timeout_s": ("Default bound on a producer's wait for its ack.",
                                 "Kafka `delivery.timeout.ms`; Pulsar `sendTimeoutMs`"),
    "broker.flush_timeout_s": ("Bound on the unload's WAL flush step.", NONE),
    "broker.close_timeout_s": ("Bound on each close step of a hosted topic (readers, uploader, WAL).", NONE),
    "broker.auto_create": ("A produce or consume of a topic that does not exist creates it. Off: they fail with "
                           "TopicNotFound (CLI exit 7) and write nothing; `dnb topic create` creates. On by "
                           "default, as in Kafka and Pulsar, so a first produce just works; turn it off in "
                           "production so a typo'd name is an error, not a new topic. A deleted topic is "
                           "never re-created implicitly.",
                           "Kafka `auto.create.topics.enable`; Pulsar `allowAutoTopicCreation`"),
    "broker.own_history_elsewhere": ("A load of a topic this broker id holds unsealed, whose open history's WAL is "
                                     "not in this data dir (a mistyped `--data-dir`, the wrong disk): `refuse` "
                                     "(OwnHistoryElsewhere, CLI exit 3, nothing written) or `take_over` (as a "
                                     "failover: its unarchived messages are recorded lost and their offsets "
                                     "reused; for a broker whose disk was replaced on purpose). `dnb restore "
                                     "--takeover` accepts it for one topic.", NONE),
    "broker.metrics_per_topic": ("Metric series per topic (`true`) or one aggregated `topic=\"_all\"` series "
                                 "per family (`false`, for hosts of many topics; docs/METRICS.md). Unset: per "
                                 "topic.", "Kafka's per-topic `kafka.log` / `BrokerTopicMetrics` MBeans (always "
                                 "per topic); Pulsar `exposeTopicLevelMetricsInPrometheus`"),
    "broker.gc_freeze": ("Freeze the objects of loaded topics out of Python's cyclic garbage collector "
                         "(`gc.freeze()` after each load), so its full collections do not walk every topic's "
                         "state with the GIL held: at 1,000 topics that pause (10-40 ms) set the produce p99. "
                         "Garbage cycles left by unloaded topics are reclaimed by one full collection per "
                         "`gc_refreeze_interval_s` (docs/WAL.md).", "Instagram's `gc.freeze()` (CPython 3.7+)"),
    "broker.gc_refreeze_interval_s": ("At most this often, and only after loads or unloads: unfreeze, collect "
                                      "everything (one pause of the length above), freeze again.", NONE),
    "broker.failed_wal_check_interval_s": ("How often the host looks for topics whose WAL failed on its own (a "
                                           "segment write on a full disk) and reopens them from their files, as a "
                                           "restart would: nothing acknowledged is lost, and the topic takes "
                                           "appends again once the disk allows. A load or an unload of such a "
                                           "topic reopens it at once.", NONE),
    "broker.cursor_flush_every_acks": ("Write a subscription's cursor after this many acks ...", NONE),
    "broker.cursor_flush_interval_s": ("... or after this long, whichever comes first.",
                                       "Pulsar `managedLedgerCursorPositionFlushSeconds`; Kafka "
                                       "`auto.commit.interval.ms`"),
    "broker.subscriptions_max": ("Subscriptions a topic may have (stored cursors). Any client can name a new "
                                 "one and each is kept until it is deleted (`DELETE .../subscriptions/NAME`, "
                                 "`dnb unsubscribe`), so a new one past this is refused "
                                 "(`409 TooManySubscriptions`).", "Pulsar `maxSubscriptionsPerTopic`"),
    "broker.upload_workers_max": ("Threads running the background uploads of all hosted topics (one bounded "
                                  "pool per broker; seals drain on their own thread).",
                                  "Kafka `remote.log.manager.thread.pool.size`"),
    # -- watcher -------------------------------------------------------------------------
    "watcher.retry_attempts_max": ("Attempts of one load/unload started by an assignment change; the window "
                                   "must outlast a peer's seal.", NONE),
    "watcher.retry_backoff_s": ("First back-off between those attempts.", NONE),
    "watcher.retry_backoff_max_s": ("Largest back-off.", NONE),
    "watcher.workers_max": ("Topics loaded or unloaded in parallel.", NONE),
    "watcher.stop_timeout_s": ("Bound on stopping the watcher.", NONE),
    "watcher.unload_retry_max_s": ("An unload that failed `retry_attempts_max` times is retried, one attempt "
                                   "per round, while the topic is still hosted here, not fenced and not "
                                   "assigned here again; the largest back-off between those rounds.", NONE),
    # -- server (dnb broker run) ---------------------------------------------------------
    "server.listen_host": ("Address the HTTP API binds to (`--listen HOST:PORT`).",
                           "Kafka `listeners`; Pulsar `bindAddress`"),
    "server.listen_port": ("Port the HTTP API binds to (0: any free port).",
                           "Kafka `listeners`; Pulsar `webServicePort`"),
    "server.shutdown_timeout_s": ("After SIGTERM, topics not sealed within this are abandoned (recoverable, "
                                  "like a crash) and the process exits 1.",
                                  "Pulsar `brokerShutdownTimeoutMs`"),
    "server.nic_bps": ("This broker's network capacity, bytes/s each way, in its load reports (the "
                       "weighted_load strategy's NIC utilisation). Unset: unknown, measured against the "
                       "busiest broker and never a bottleneck.",
                       "Pulsar `loadBalancerOverrideBrokerNicSpeedGbps`"),
    "server.disk_bps": ("This broker's disk throughput capacity, bytes/s, in its load reports (the "
                        "weighted_load strategy's disk utilisation). Unset: unknown, as for `nic_bps`.", NONE),
    # -- load_manager (decision core; see docs/LOAD_MANAGER.md) --------------------------
    "load_manager.load_report_interval_s": ("How often each broker reports its load.",
                                            "Pulsar `loadBalancerReportUpdateMaxIntervalMinutes`"),
    "load_manager.assignment_strategy": ("How a broker's load score is computed: `fair`, `balanced` or "
                                         "`weighted_load`.", "Pulsar `loadBalancerLoadSheddingStrategy`"),
    "load_manager.rebalancing.enabled": ("Move topics automatically when the cluster is unbalanced.",
                                         "Pulsar `loadBalancerSheddingEnabled`"),
    "load_manager.rebalancing.aggressiveness": ("Preset (`conservative`, `balanced`, `aggressive`) for the "
                                                "four settings below that are unset.", NONE),
    "load_manager.rebalancing.cv_threshold": ("Rebalance when the coefficient of variation of broker loads "
                                              "exceeds this. Unset: from the preset.",
                                              "Pulsar `loadBalancerBrokerThresholdShedderPercentage`"),
    "load_manager.rebalancing.check_interval_s": ("How often balance is checked. Unset: from the preset.",
                                                  "Pulsar `loadBalancerSheddingIntervalMinutes`"),
    "load_manager.rebalancing.max_moves_per_hour": ("Automatic moves allowed per hour. Unset: from the preset.",
                                                    "Pulsar `loadBalancerMaxNumberOfBrokerSheddingPerCycle` "
                                                    "(per cycle)"),
    "load_manager.rebalancing.cooldown_s": ("A moved topic is not moved again automatically for this long. "
                                            "Unset: from the preset.",
                                            "Pulsar `loadBalancerSheddingGracePeriodMinutes`"),
    "load_manager.rebalancing.min_brokers_for_rebalance": ("No rebalancing with fewer live brokers.", NONE),
    "load_manager.rebalancing.min_topic_age_s": ("Topics younger than this are not moved automatically.", NONE),
    "load_manager.rebalancing.blacklist_topics": ("fnmatch patterns of `/ns/topic` never moved automatically "
                                                  "(env: comma-separated).", NONE),
    "load_manager.rebalancing.paused": ("Operator pause: checks still compute balance but never move.", NONE),
    "load_manager.rebalancing.hit_count": ("Consecutive checks above the threshold before moves start.",
                                           "Pulsar `loadBalancerSheddingConditionHitCountThreshold`"),
    "load_manager.rebalancing.stop_ratio": ("Keep moving until CV falls below `stop_ratio × cv_threshold`.",
                                            NONE),
    "load_manager.rebalancing.settle_delay_s": ("After a move, no automatic move until this long has passed and "
                                                "the brokers involved have reported.", NONE),
    "load_manager.rebalancing.pingpong_window_s": ("A topic is never moved automatically back to a broker it "
                                                   "left within this window.", NONE),
    "load_manager.rebalancing.gain_ratio_min": ("A move must lower the predicted CV by at least this fraction.",
                                                NONE),
    "load_manager.rebalancing.pair_gap_min": ("Only move between brokers whose loads differ by at least this "
                                              "fraction of the mean.", NONE),
    "load_manager.rebalancing.gain_fraction_min": ("Take the lightest topic whose gain is at least this "
                                                   "fraction of the best gain.", NONE),
    "load_manager.rebalancing.sources_per_check_max": ("Most loaded brokers tried as the source per check.",
                                                       NONE),
    "load_manager.report_stale_intervals": ("A report older than this many report intervals is stale (no new "
                                            "topics for that broker, no rebalancing).", NONE),
    "load_manager.placement_band_ratio": ("Round-robin among brokers within this fraction of the minimum "
                                          "score ...", NONE),
    "load_manager.placement_band_abs": ("... or within this absolute score.", NONE),
    "load_manager.max_topics_per_broker": ("No new topics for a broker hosting this many. Unset: no limit.",
                                           "Pulsar `loadBalancerBrokerMaxTopics`"),
    "load_manager.drain_parallel": ("Topics a draining broker hands over at the same time.", NONE),
    "load_manager.assign_timeout_s": ("An assignment not loaded after this long is re-put.", NONE),
    "load_manager.assign_retries_max": ("Re-puts before the topic is given to another broker.", NONE),
    "load_manager.release_timeout_s": ("A release (seal) not done after this long raises an alarm.", NONE),
    "load_manager.connection_cost_bps": ("Each connection costs CPU like this many bytes per second.", NONE),
    "load_manager.smoothing_alpha": ("EMA weight of the newest load report, (0, 1].",
                                     "Pulsar `loadBalancerHistoryResourcePercentage` (= 1 − alpha)"),
    "load_manager.balanced_topic_load": ("`balanced` strategy's topic term: `relative` or `absolute`.", NONE),
    "load_manager.failover.grace_s": ("Wait this long after a registration vanished before reassigning its "
                                      "topics (a broker back in time recovers its own WAL).", NONE),
    "load_manager.failover.grace_unstable_s": ("The grace when the leader's own session recovered recently.",
                                               NONE),
    "load_manager.failover.stable_after_s": ("The leader's session counts as stable after this long.", NONE),
    "load_manager.failover.mass_fraction": ("More than this fraction of brokers vanishing together suspends "
                                            "failover (a store or network fault, not crashes) ...", NONE),
    "load_manager.failover.mass_window_s": ("... when they vanish within this window ...", NONE),
    "load_manager.failover.mass_hold_s": ("... for this long after the last of them.", NONE),
    "load_manager.failover.rebalance_pause_checks": ("Rebalancing waits this many check intervals after a "
                                                     "failover.", NONE),
    "load_manager.weighted_load.bottleneck_threshold": ("A utilisation above this is a bottleneck and gets "
                                                        "half of the weight.",
                                                        "Pulsar `loadBalancerBrokerOverloadedThresholdPercentage`"),
    "load_manager.weighted_load.topic_load_capacity": ("Weighted topic load one capacity unit carries. Unset: "
                                                       "relative to the most loaded broker.", NONE),
    # -- object_store --------------------------------------------------------------------
    "object_store.max_attempts": ("Attempts per S3 call, the first included (botocore `standard` retries with "
                                  "backoff). Unset: 5 in `dnb broker run`, 2 in a one-shot command. A "
                                  "`?max_attempts=` in the objects URL wins.",
                                  "Kafka RSM `s3.client.retry…` (plugin-specific); AWS SDK `max_attempts`"),
    "object_store.connect_timeout_s": ("Wait for a TCP connection to the S3 endpoint this long. Unset: 3 in "
                                       "`dnb broker run`, 1 in a one-shot command.",
                                       "AWS SDK `connect_timeout`"),
    "object_store.read_timeout_s": ("Wait for a response this long once connected.", "AWS SDK `read_timeout`"),
    "object_store.check_bucket": ("HEAD the bucket when a broker or command opens the store: a missing bucket "
                                  "(`BucketNotFound`, exit 2) or an unreachable endpoint "
                                  "(`StorageUnavailable`, exit 4) fails the start, not the first upload.", NONE),
}
