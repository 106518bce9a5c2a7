"""A small asyncio TCP proxy for link-level faults (no toxiproxy here).

The stack reaches the gateway through it, so a scenario can make the *connection* misbehave, which
the simulator's HTTP faults cannot: `hang` accepts and reads but never answers (a black hole),
`slow` forwards every chunk late (a slow link), `reset` closes new connections at once. The mode
applies to connections opened after it is set; open keep-alive connections are cut on a change so
no request slips through on an old socket.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

Mode = Literal["pass", "hang", "slow", "reset"]


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, slow_delay_s: float = 1.0):
        self.upstream = (upstream_host, upstream_port)
        self.slow_delay_s = slow_delay_s
        self.mode: Mode = "pass"
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "TcpProxy":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def set_mode(self, mode: Mode) -> None:
        self.mode = mode
        asyncio.run_coroutine_threadsafe(self._cut_all(), self._loop).result(10)

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        asyncio.run_coroutine_threadsafe(self._cut_all(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _cut_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        mode = self.mode
        try:
            if mode == "reset":
                return
            if mode == "hang":
                while await reader.read(65536):  # swallow the request, never answer
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            self._writers.add(up_writer)
            delay = self.slow_delay_s if mode == "slow" else 0.0
            await asyncio.gather(self._pipe(reader, up_writer, 0.0), self._pipe(up_reader, writer, delay))
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            self._writers.discard(writer)
