"""Service: an Engine, its EngineLoop and the HTTP server, started and closed in order."""

from __future__ import annotations

import threading
from typing import Optional

from .config import EngineConfig
from .engine import ConnectorSpec, Engine
from .loop import EngineLoop
from .server import CompletionServer


class Service:
    """Serve `cfg` on host:port (0 = any free port). close() is idempotent and ordered:
    stop accepting, stop the engine loop (in-flight requests get an error), then release the
    engine (connector halves, KV pool and its /dev/shm file)."""

    def __init__(self, cfg: EngineConfig, connector: ConnectorSpec = None, host: str = "127.0.0.1",
                 port: int = 0, request_timeout_s: float = 600.0):
        self.engine = Engine(cfg, connector)
        self.loop: Optional[EngineLoop] = None
        self.server: Optional[CompletionServer] = None
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        try:
            self.loop = EngineLoop(self.engine)
            self.server = CompletionServer((host, port), self.loop, cfg.model.name, cfg.model.vocab,
                                           request_timeout_s=request_timeout_s)
            self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                                            name="refengine-http", daemon=True)
            self._thread.start()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.server is not None:
            if self._thread is not None:
                self.server.shutdown()
                self._thread.join(10)
            self.server.server_close()
        if self.loop is not None:
            self.loop.close()
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
