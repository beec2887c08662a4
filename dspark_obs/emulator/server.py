"""SGLang 0.5.23's HTTP surface over the emulator engine.

Endpoints: ``POST /generate``, ``GET /server_info`` (and the deprecated
``/get_server_info``), ``POST /set_internal_state`` (``dspark_clear_info_records``),
``GET /metrics`` (``sglang:spec_*``), ``GET /health``, ``GET /get_model_info``.
Bodies and field names are SGLang's, so a collector written against the
emulator works unchanged against a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from typing import Any, Optional

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dspark_obs import costtable as ct
from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest

SGLANG_VERSION = "0.5.23"
MODEL_PATH = "dspark-obs/emulator-target"


def _server_args(cfg: EngineConfig, port: int) -> dict[str, Any]:
    return {
        "model_path": MODEL_PATH,
        "tokenizer_path": MODEL_PATH,
        "host": "127.0.0.1",
        "port": port,
        "dp_size": cfg.dp_size,
        "enable_dp_attention": cfg.dp_size > 1,
        "max_running_requests": cfg.max_running_requests,
        "random_seed": cfg.seed,
        "speculative_algorithm": "DSPARK",
        "speculative_dspark_block_size": cfg.gamma,
        "speculative_num_draft_tokens": cfg.gamma + 1,
        "speculative_dspark_sps_table_path": None,
        "speculative_dspark_confidence_sts_path": None,
        "enable_metrics": True,
        "emulator": True,
    }


class EmulatorApp:
    """The Starlette app and the engine behind it."""

    def __init__(self, cfg: EngineConfig, *, port: int = 30000,
                 launch_command: Optional[str] = None) -> None:
        self.cfg = cfg
        self.port = port
        self.engine = Engine(cfg)
        self.startup_time = time.time()
        self.launch_command = launch_command or " ".join(sys.argv)
        self.env = {
            "SGLANG_RAGGED_VERIFY_MODE": cfg.mode,
            "SGLANG_DSPARK_DEBUG_DUMP": ",".join(sorted(cfg.components)),
            "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS": str(cfg.lag_steps),
        }
        self.app = Starlette(routes=[
            Route("/generate", self.generate, methods=["POST"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/set_internal_state", self.set_internal_state, methods=["POST"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/health_generate", self.health, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
        ], lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self.engine.start()
        try:
            yield
        finally:
            self.engine.stop()

    async def generate(self, request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError as exc:
            return JSONResponse({"error": {"message": f"invalid JSON: {exc}"}}, status_code=400)
        if not isinstance(body, dict):
            return JSONResponse({"error": {"message": "body must be a JSON object"}}, status_code=400)
        if body.get("stream"):
            return JSONResponse({"error": {"message": "the emulator does not stream; send stream=false"}},
                                status_code=400)
        sp = body.get("sampling_params") or {}
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is None and input_ids is None:
            return JSONResponse({"error": {"message": "one of text or input_ids is required"}}, status_code=400)
        rid = body.get("rid") or f"emu-{os.urandom(8).hex()}"
        try:
            req = GenerateRequest(
                rid=str(rid), text=text, input_ids=input_ids,
                temperature=float(sp.get("temperature", 1.0)),
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                sampling_seed=sp.get("sampling_seed"),
                return_logprob=bool(body.get("return_logprob", False)),
                top_logprobs_num=int(body.get("top_logprobs_num") or 0),
            )
            fut = self.engine.submit(req)
        except (TypeError, ValueError) as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        result = await asyncio.wrap_future(fut)
        return Response(msgspec.json.encode(result), media_type="application/json")

    async def server_info(self, request: Request) -> Response:
        payloads = self.engine.dump()
        gauges = self.engine.spec_gauges()
        internal = []
        for payload in payloads:
            state: dict[str, Any] = {"last_gen_throughput": 0.0}
            if "spec_accept_length" in gauges:
                state["avg_spec_accept_length"] = gauges["spec_accept_length"]
            if payload is not None:
                state["dspark_info_record"] = payload
            internal.append(state)
        body = {
            **_server_args(self.cfg, self.port),
            "internal_states": internal,
            "version": SGLANG_VERSION,
            "launch_command": self.launch_command,
            "startup_time": self.startup_time,
            "env": self.env,
        }
        return Response(msgspec.json.encode(body), media_type="application/json")

    async def set_internal_state(self, request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body())
            args = body.get("server_args", {})
        except (msgspec.DecodeError, AttributeError):
            return JSONResponse({"updated": False, "error": "body must be {\"server_args\": {...}}"}, status_code=400)
        unknown = [k for k in args if k != "dspark_clear_info_records"]
        if unknown:
            return JSONResponse({"updated": False})
        if args.get("dspark_clear_info_records"):
            self.engine.clear_records()
        return JSONResponse({"updated": True})

    async def metrics(self, request: Request) -> Response:
        gauges = self.engine.spec_gauges()
        labels = f'model_name="{MODEL_PATH}",engine_type="unified"'
        lines = []
        for name, value in sorted(gauges.items()):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines.append(f"# HELP sglang:{name} DSpark {name.replace('_', ' ')}.")
            lines.append(f"# TYPE sglang:{name} {kind}")
            lines.append(f"sglang:{name}{{{labels}}} {value}")
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(self, request: Request) -> Response:
        return JSONResponse({"model_path": MODEL_PATH, "tokenizer_path": MODEL_PATH, "is_generation": True})


class BackgroundServer:
    """Run the emulator in this process on a background thread (tests, demo)."""

    def __init__(self, cfg: EngineConfig, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.cfg, self.host = cfg, host
        self._requested_port = port
        self.emulator: Optional[EmulatorApp] = None
        self._server: Optional[uvicorn.Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "BackgroundServer":
        import socket

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._requested_port))
        self.port = sock.getsockname()[1]
        self.emulator = EmulatorApp(self.cfg, port=self.port, launch_command="dspark-obs emulate")
        config = uvicorn.Config(self.emulator.app, log_level="warning", access_log=False, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.time() + 15
        while not self._server.started:
            if time.time() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"emulator failed to start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(cfg: EngineConfig, *, host: str = "127.0.0.1", port: int = 30000) -> None:
    """Serve in the foreground until interrupted (``dspark-obs emulate``)."""
    emulator = EmulatorApp(cfg, port=port)
    uvicorn.run(emulator.app, host=host, port=port, log_level="warning", access_log=False)


def load_sts_temperatures(path: str) -> tuple[float, ...]:
    """Temperatures from an SGLang STS calibration JSON (``{temperatures: [...]}``)."""
    data = msgspec.json.decode(open(path, "rb").read())
    temps = data.get("temperatures") if isinstance(data, dict) else None
    if not isinstance(temps, list) or not temps or not all(isinstance(t, (int, float)) and t > 0 for t in temps):
        raise ValueError(f"{path}: expected {{\"temperatures\": [positive floats]}}, got {str(data)[:200]}")
    return tuple(float(t) for t in temps)


def load_sps_table(path: str) -> ct.CostTable:
    return ct.load(path)
