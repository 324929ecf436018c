"""A TCP forwarder on a thread: ``listen`` → ``target``, byte for byte, one upstream
connection per client connection.

Why hand-written: the partition cases need the shared stack's Postgres (bound to 127.0.0.1)
reachable from inside a network namespace, and no library in our dependencies forwards TCP
(socat is not installed either). It never closes or resets anything on its own: a client cut
off by a partition sees silence, and Postgres sees the forwarder's connection as alive, as it
would see a client behind a silent network.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType


class Forwarder:
    def __init__(self, listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
        self.listen = (listen_host, listen_port)
        self.target = (target_host, target_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-forward", daemon=True)
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)

    def __enter__(self) -> Forwarder:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, *self.listen, reuse_address=True), self._loop
        ).result(timeout=10)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        server = self._server
        if server is not None:
            async def close() -> None:
                server.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
