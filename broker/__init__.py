"""The broker: aiohttp server, replica manager, partition state, delayed operations.

Modules:

- ``partition_state`` -- pure: roles, epochs, ISR, HW math, follower caught-up tracking, ISR changes.
- ``purgatory`` / ``delayed`` -- pure: keyed waiters; delayed produce (acks=all) and delayed fetch.
- ``requests`` -- decoding and bounds-checking of request bodies (HTTP 400 on bad input).
- ``replica_manager`` -- the I/O shell: logs, LeaderAndIsr/StopReplica/UpdateMetadata, produce, fetch,
  offsets, AlterPartition requests, HW checkpoints; implements ``fetcher.api.FollowerPartitions``.
- ``partition`` -- one hosted partition (log + state value); ``metadata_cache`` -- what the controller said.
- ``server`` -- thin aiohttp handlers, ``/v1/status``, ``/metrics``; ``metrics`` -- Prometheus registry.
- ``controller_link`` -- registration, heartbeats, AlterPartition sending, controlled shutdown.
- ``process`` -- one broker process (start-up, data dir, SIGTERM); ``cli`` -- ``minibroker broker``,
  ``minibroker perf broker`` (``bench``).
"""
