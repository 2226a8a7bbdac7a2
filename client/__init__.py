"""Asyncio producer, consumer and admin client."""
