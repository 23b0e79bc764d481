"""The Jupyter server extension: every kernel of the server and what it holds.

``GET {base_url}api/gpumem/kernels`` answers with every running kernel of the server
(its notebook or console path, pid, descendants, host memory and GPU memory per device)
and the other processes on the GPUs (orphans, other users', this user's other ones);
``GET {base_url}api/gpumem/metrics`` gives the same figures in Prometheus' text format;
``POST {base_url}api/gpumem/orphans`` with ``{"dry_run": bool}`` ends this user's
orphans that a kernel left (``%gpumem purge --orphans``), for a frontend with no kernel
of the extension at hand. The JSON: docs/PROTOCOL.md, "Server extension".

Enabled on ``pip install`` by ``jupyter-config/jupyter_server_config.d/jupyter_gpumem.json``;
never imported by the IPython extension. It starts no thread: readings happen when
asked (:class:`.readings.Readings`, a 1 s cache shared by the endpoints).
"""
from __future__ import annotations

from jupyter_server.utils import url_path_join

from .handlers import (KERNELS_PATH, METRICS_PATH, ORPHANS_PATH, READINGS, KernelsHandler,
                       MetricsHandler, OrphansHandler)
from .readings import SCHEMA, Readings, kernel_pid, report, server_kernels

__all__ = ["KERNELS_PATH", "METRICS_PATH", "ORPHANS_PATH", "SCHEMA", "Readings", "kernel_pid",
           "report", "server_kernels"]


def _load_jupyter_server_extension(serverapp) -> None:
    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    web_app.settings[READINGS] = Readings()
    web_app.add_handlers(".*$", [(url_path_join(base, KERNELS_PATH), KernelsHandler),
                                 (url_path_join(base, METRICS_PATH), MetricsHandler),
                                 (url_path_join(base, ORPHANS_PATH), OrphansHandler)])
    serverapp.log.info("jupyter_gpumem: %s, %s", url_path_join(base, KERNELS_PATH),
                       url_path_join(base, METRICS_PATH))
