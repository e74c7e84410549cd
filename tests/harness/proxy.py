"""A TCP proxy in front of a PostgreSQL server that can hang: it stops forwarding and
keeps every socket open, as a hung PgBouncer or cloud SQL proxy does.

`Proxy` listens on a free port of 127.0.0.1 and forwards each connection to its
``upstream`` (a host and port, or the path of a server's Unix socket), in an asyncio
loop on a thread of its own, so that a test (synchronous, its workers in other
processes) drives it with plain method calls.

What the client sees of a hung connection: nothing. No error, no reset, no FIN; its
packets are acknowledged by the proxy's kernel, so TCP keepalives are answered and a
TCP user timeout never fires. Only a deadline of the client's own can tell.

- `wedge` hangs every connection open now, for good: the proxy reads no more of their
  bytes and writes none (a query sent before the wedge and not yet forwarded never
  reaches the server; an answer not yet forwarded never reaches the client).
  ``new="forward"``: connections made from then on are forwarded normally (a proxy
  whose old connections are stuck, its new ones fine); ``new="hang"``: they are
  accepted and wait, unforwarded, until `end` (a proxy that serves nobody until its
  upstream comes back); then they are forwarded. The wedged ones stay wedged.
- `freeze_listeners` wedges only the connections that sent a ``LISTEN`` (without TLS
  the protocol is plain text, and the proxy reads the client's bytes as they pass).
- ``upstream`` may be changed at any time: new connections go there (an address that
  moves at a failover).

`close` closes every socket, wedged ones too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from psycopg.conninfo import conninfo_to_dict, make_conninfo

T = TypeVar("T")

Upstream = tuple[str, int] | str  # (host, port), or the path of a Unix socket

LISTEN = b'LISTEN "asyncq.'


def upstream_of(dsn: str) -> Upstream:
    """Where ``dsn`` leads: its host and port, or its Unix socket's path (a ``host`` that
    is a directory, as libpq reads it)."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/tmp")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return str(Path(host) / f".s.PGSQL.{port}")
    return host, port


@dataclass(eq=False)
class Pipe:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    opened_at: float = field(default_factory=time.time)
    listening: bool = False  # the client sent a LISTEN
    wedged: bool = False
    closed: bool = False
    pumps: list[asyncio.Task[None]] = field(default_factory=list)


class Proxy:
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.pipes: list[Pipe] = []
        self.hanging_new = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._thread.start()
        self._serving = asyncio.Event()  # new connections are forwarded (bound on first use)
        self._serving.set()
        self._server = self._call(asyncio.start_server(self._accepted, "127.0.0.1", 0), timeout=10)
        self.port: int = self._server.sockets[0].getsockname()[1]

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def route(self, dsn: str) -> str:
        """``dsn`` through the proxy: its user, database and options, the proxy's address."""
        return make_conninfo(dsn, host="127.0.0.1", port=self.port, sslmode="disable")

    # -- driven from the test's thread ----------------------------------------------------

    def wedge(self, *, new: Literal["forward", "hang"] = "forward") -> int:
        """Hang every open connection for good; new ones are forwarded, or wait for `end`.
        Returns how many were wedged."""
        return self._call(self._wedge(lambda pipe: True, hang_new=new == "hang"))

    def end(self) -> None:
        """New connections (and those waiting since `wedge`) are forwarded again."""
        self._call(self._end())

    def freeze_listeners(self) -> int:
        """Hang every open LISTEN connection for good; returns how many."""
        return self._call(self._wedge(lambda pipe: pipe.listening, hang_new=False))

    def listeners(self) -> list[Pipe]:
        """The LISTEN connections open and forwarded."""
        return [p for p in list(self.pipes) if p.listening and not (p.closed or p.wedged)]

    def wedged(self) -> list[Pipe]:
        return [p for p in list(self.pipes) if p.wedged]

    def close(self) -> None:
        if not self._loop.is_running():
            return
        with contextlib.suppress(TimeoutError):
            self._call(self._close(), timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 5) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- on the proxy's loop ---------------------------------------------------------------

    async def _wedge(self, which: Callable[[Pipe], bool], *, hang_new: bool) -> int:
        if hang_new:
            self.hanging_new = True
            self._serving.clear()
        found = [p for p in self.pipes if not (p.closed or p.wedged) and which(p)]
        for pipe in found:
            pipe.wedged = True
            for pump in pipe.pumps:
                pump.cancel()  # the sockets stay open: only the forwarding stops
        return len(found)

    async def _end(self) -> None:
        self.hanging_new = False
        self._serving.set()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pipe = Pipe(client=writer)
        self.pipes.append(pipe)
        await self._serving.wait()  # accepted by the kernel all the same: the client waits
        if pipe.wedged or pipe.closed:
            return
        target = self.upstream
        try:
            if isinstance(target, str):
                up_reader, up_writer = await asyncio.open_unix_connection(target)
            else:
                up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            self._close_pipe(pipe)
            return
        pipe.upstream = up_writer
        if pipe.closed:  # the proxy closed meanwhile
            up_writer.transport.abort()
            return
        if pipe.wedged:
            return
        pipe.pumps = [
            asyncio.ensure_future(self._pump(pipe, reader, up_writer, sniff=True)),
            asyncio.ensure_future(self._pump(pipe, up_reader, writer, sniff=False)),
        ]

    async def _pump(
        self,
        pipe: Pipe,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        sniff: bool,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if sniff and LISTEN in data:
                    pipe.listening = True
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        # One side closed (or broke): close the other, as a proxy does. Not if wedged:
        # then this pump was cancelled, and the sockets stay open.
        self._close_pipe(pipe)

    def _close_pipe(self, pipe: Pipe) -> None:
        pipe.closed = True
        for writer in (pipe.client, pipe.upstream):
            if writer is None:
                continue
            if pipe.wedged:
                writer.transport.abort()
            else:
                writer.close()

    async def _close(self) -> None:
        self._server.close()
        writers = []
        for pipe in self.pipes:
            for pump in pipe.pumps:
                pump.cancel()
            pipe.wedged = True  # abort, no more forwarding
            self._close_pipe(pipe)
            writers += [w for w in (pipe.client, pipe.upstream) if w is not None]
        self._serving.set()  # the connections still waiting see the proxy closed, and end
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
