"""The server extension's endpoints (authenticated and authorized by the server, as its
own kernel API is: resource ``kernels``). Their JSON: docs/PROTOCOL.md, "Server
extension". Bodies are read by :func:`.body.parse` alone; a refused one is a 400."""
from __future__ import annotations

import asyncio
import json
import os

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.processes import orphans as _orphans
from ..core import processes as _processes
from . import body as _body
from . import metrics as _metrics
from .readings import Readings, server_kernels

KERNELS_PATH = "api/gpumem/kernels"
ORPHANS_PATH = "api/gpumem/orphans"
METRICS_PATH = "api/gpumem/metrics"
READINGS = "jupyter_gpumem_readings"      # the web app's setting that holds the Readings


def readings(handler: APIHandler) -> Readings:
    """The server's one :class:`Readings` (made at the extension's load)."""
    found = handler.settings.get(READINGS)
    if found is None:
        found = handler.settings[READINGS] = Readings()
    return found


class GpumemHandler(APIHandler):
    auth_resource = "kernels"

    def json_body(self, default=None):
        try:
            return _body.parse(self.request.body, default)
        except _body.BadBody as exc:
            raise web.HTTPError(400, str(exc)) from None

    async def report(self) -> dict:
        kernels = await server_kernels(self.serverapp)
        return await asyncio.get_running_loop().run_in_executor(
            None, readings(self).report, kernels)


class KernelsHandler(GpumemHandler):
    """``GET api/gpumem/kernels``."""

    @web.authenticated
    @authorized
    async def get(self):
        self.finish(json.dumps(await self.report()))


class MetricsHandler(GpumemHandler):
    """``GET api/gpumem/metrics``: Prometheus' text format."""

    @web.authenticated
    @authorized
    async def get(self):
        data = await self.report()
        last = readings(self).last
        text = _metrics.text(data, last.seconds if last else None, readings(self).passes)
        self.finish(text, set_content_type=_metrics.CONTENT_TYPE)


class OrphansHandler(GpumemHandler):
    """``POST api/gpumem/orphans`` ``{"dry_run": bool}``: ``%gpumem purge --orphans``."""

    @web.authenticated
    @authorized
    async def post(self):
        data = self.json_body(default={})
        if not isinstance(data, dict) or set(data) - {"dry_run"}:
            raise web.HTTPError(400, 'the body must be {"dry_run": true|false}')
        dry_run = data.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise web.HTTPError(400, '"dry_run" must be true or false')
        ctx = _processes.context(me=os.getpid(), server_pid=os.getpid())
        result = await asyncio.get_running_loop().run_in_executor(
            None, lambda: _orphans.purge_orphans(dry_run=dry_run, ctx=ctx))
        if result.steps:
            readings(self).forget()
        self.finish(json.dumps(result.to_json()))
