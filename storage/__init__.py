"""Segment-file log storage: record batches, segments, indexes, checkpoints, recovery."""
