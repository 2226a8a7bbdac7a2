"""The broker: aiohttp server, replica manager, partition state, delayed operations."""
