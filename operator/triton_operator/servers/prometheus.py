"""The operator's Prometheus endpoint (`run --metrics-port`, 8081), served in the operator's event loop on a
`tls_server.PlainSite` (issue 39, M4).

prometheus-client's own `start_http_server` starts a thread per connection and never times one out, and the chart's
NetworkPolicy opens this port to every namespace: any pod could hold thousands of threads in the operator. Here the
connections open at once have a cap (`MAX_CONNECTIONS`: Prometheus needs one or two; one over it is reset at the
accept), the request line and headers must come within `tls_server.IDLE_SECONDS`, and the answer must be taken
within `ANSWER_SECONDS` (a client that does not read it is cut off). The exposition is rendered in a worker thread,
as the scrape is CPU work that should not hold the loop.

Served at `/metrics` (and `/`, as prometheus-client's server answers any path); the format is negotiated from the
Accept header (Prometheus text or OpenMetrics), as prometheus-client does.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from . import metrics, tls_server

log = logging.getLogger("triton_operator.metrics")

#: Connections open at once (Prometheus scrapes with one).
MAX_CONNECTIONS = 32
#: How long a client has to take the whole answer, once rendered.
ANSWER_SECONDS = 10.0


async def _scrape(request: web.Request) -> web.StreamResponse:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = await asyncio.to_thread(encoder, REGISTRY)
    response = web.StreamResponse(headers={"Content-Type": content_type})
    response.content_length = len(body)
    try:
        async with asyncio.timeout(ANSWER_SECONDS):
            await response.prepare(request)
            await response.write(body)
            await response.write_eof()
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()
    return response


async def serve_metrics(host: str, port: int, max_connections: int = MAX_CONNECTIONS) -> tuple[web.AppRunner, int]:
    """Starts the endpoint on `host:port` (0: a free port); returns its runner (`cleanup()` stops it) and its port."""
    app = web.Application(client_max_size=1024)
    app.router.add_get("/metrics", _scrape)
    app.router.add_get("/", _scrape)
    runner = web.AppRunner(app, **tls_server.runner_options())
    await runner.setup()
    site = tls_server.PlainSite(runner, host, port, max_connections=max_connections,
                                refused_metric=metrics.METRICS_REFUSED)
    await site.start()
    return runner, site.port
