"""The controller: registration, liveness, topics, elections, ISR ownership, durable metadata.

Modules, from pure core to I/O shell:
  rules.py       election, assignment, AlterPartition checks, imbalance (pure, mypy-strict)
  state.py       the metadata image and the records that change it (pure, deterministic apply)
  ops.py         operations: (image, request, liveness) -> records + answer (pure)
  journal.py     checksummed msgpack journal + atomic snapshots, replay, torn-tail truncation
  propagator.py  LeaderAndIsr / UpdateMetadata / StopReplica fan-out, one sender task per broker
  controller.py  the shell: commit path (fsync, apply, log, metrics, propagate), liveness, timers
  server.py      aiohttp handlers (docs/protocol.md "Controller APIs"), /v1/status, /metrics
  cli.py         ``minibroker controller`` and ``minibroker perf controller`` (bench.py)
"""
