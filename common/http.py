"""A small msgpack-over-HTTP client shared by brokers, fetchers, the controller and clients.

One keep-alive ``aiohttp.ClientSession`` per ``RpcClient``; ``call`` posts a
msgpack body to ``/v1/<api>`` and returns the decoded map. Connection failures
and timeouts raise ``RpcConnectionError`` (the caller decides how to back off);
HTTP 4xx raise ``RpcBadRequest`` with the server's message.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from common.wire import CONTENT_TYPE, decode, encode


class RpcError(Exception):
    pass


class RpcConnectionError(RpcError):
    """The peer could not be reached, the connection broke, or the call timed out."""


class RpcBadRequest(RpcError):
    """The peer rejected the body (HTTP 4xx); the message is the server's."""


class RpcClient:
    def __init__(self, *, limit_per_host: int = 8, timeout_s: float = 30.0) -> None:
        self._limit_per_host = limit_per_host
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._limit_per_host)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def call(self, address: str, api: str, body: dict[str, Any], *,
                   timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``http://<address>/v1/<api>``; ``address`` is ``host:port``."""
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self._timeout_s)
        url = f"http://{address}/v1/{api}"
        try:
            async with session.post(url, data=encode(body), headers={"Content-Type": CONTENT_TYPE},
                                    timeout=timeout) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise RpcBadRequest(f"{api} to {address}: HTTP {resp.status}: "
                                        f"{payload.decode('utf-8', 'replace')[:500]}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RpcConnectionError(f"{api} to {address}: {exc.__class__.__name__}: {exc}") from exc
        result = decode(payload)
        if not isinstance(result, dict):
            raise RpcError(f"{api} to {address}: response is not a map")
        return result

    async def get_json(self, address: str, path: str, *, timeout_s: float | None = None) -> Any:
        session = self._get_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s if timeout_s is not None else self._timeout_s)
        try:
            async with session.get(f"http://{address}{path}", timeout=timeout) as resp:
                resp.raise_for_status()
                return await resp.json()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise RpcConnectionError(f"GET {path} from {address}: {exc}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
