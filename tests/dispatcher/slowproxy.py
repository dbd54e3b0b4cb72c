"""A TCP proxy on loopback that delays what clients send to a server: a slow store, made
of the real one. Test machinery only.

Each chunk a client sends is held ``delay_s`` (settable while it runs) before it is
forwarded, in order per connection; answers flow back at once. It runs its own event loop
on a thread, so the process under test (an asyncio dispatcher) cannot slow it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

__all__ = ["SlowProxy"]


class SlowProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.delay_s = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> SlowProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the slow proxy did not start")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            self._loop.run_until_complete(
                asyncio.gather(*self._tasks, return_exceptions=True))
            self._loop.close()

    # -- forwarding -----------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for task in (self._pipe(reader, up_writer, delayed=True),
                     self._pipe(up_reader, writer, delayed=False)):
            t = asyncio.create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                    delayed: bool) -> None:
        try:
            while chunk := await reader.read(65536):
                if delayed and self.delay_s > 0:
                    await asyncio.sleep(self.delay_s)
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # either side went away: close the other below
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()
