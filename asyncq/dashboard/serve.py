"""``asyncq dashboard``: the dashboard on its own, served by uvicorn in the running event
loop while the CLI holds the App open."""

from __future__ import annotations

import uvicorn

from asyncq.app import App
from asyncq.dashboard.app import create_app


async def serve(app: App, *, host: str, port: int, read_only: bool) -> None:
    config = uvicorn.Config(
        create_app(app, read_only=read_only),
        host=host,
        port=port,
        log_config=None,  # the CLI has configured logging
        lifespan="off",
        server_header=False,
    )
    await uvicorn.Server(config).serve()
