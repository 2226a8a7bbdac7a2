"""Replica fetchers: one asyncio task per (leader broker, fetcher id).

- ``api``: the contract with the broker (``InitialFetchState``, ``FollowerPartitions``).
- ``state``: pure per-partition fetch state and the KIP-279 / out-of-range decisions.
- ``endpoint``: ``LeaderEndpoint`` (Fetch, OffsetsForLeaderEpoch, ListOffsets) and its HTTP form.
- ``task``: ``FetcherTask`` with ``do_work()`` (truncate, fetch, process) and the run loop.
- ``manager``: ``ReplicaFetcherManager`` (placement by stable hash, on-demand tasks, idle shutdown).
- ``metrics``: Prometheus series and plain counters; ``bench``: the replication benchmark.
"""
