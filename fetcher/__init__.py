"""Replica fetchers: one asyncio task per (leader broker, fetcher id)."""
