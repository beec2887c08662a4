"""SGLang 0.5.23's HTTP surface over the emulator engine.

Endpoints: ``POST /generate``, ``POST /v1/completions`` and
``POST /v1/chat/completions`` (non-streaming, with ``sglext.spec_tokens_details``
when ``return_spec_tokens_details`` is set), ``GET /v1/models``,
``GET /server_info`` (and the deprecated ``/get_server_info``),
``POST /set_internal_state`` (``dspark_clear_info_records``), ``GET /metrics``
(``sglang:spec_*``), ``GET /health``, ``GET /get_model_info``.  Bodies and field
names are SGLang's, so a collector written against the emulator works
unchanged against a real server.

``serve`` reads SGLang's environment the way a server launched with it would
(:func:`config_from_env`).  With ``test_hooks`` (``DSPARK_OBS_EMULATOR_TEST_HOOKS=1``)
``POST /emulator/restart`` restarts the engine in place: a new
``startup_time`` and ``forward_ct`` from 0, as after a server restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Any, Mapping, Optional

import msgspec
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dspark_obs import costtable as ct
from dspark_obs.emulator.dumper import ALL_COMPONENTS
from dspark_obs.emulator.engine import Engine, EngineConfig, GenerateRequest, detokenize
from dspark_obs.emulator.methods import check_force_budget_frac
from dspark_obs.emulator.subprocess_server import SubprocessServer  # noqa: F401 - callers import it from here

SGLANG_VERSION = "0.5.23"
MODEL_PATH = "dspark-obs/emulator-target"


def make_engine(cfg: EngineConfig) -> Engine:
    """The engine ``cfg`` asks for: the real-model engine for a ``RealModelConfig``, else the stochastic one."""
    if getattr(cfg, "model", None):
        # at call time: only --model loads torch (the optional [model] extra)
        from dspark_obs.emulator.realmodel.engine import RealModelEngine

        return RealModelEngine(cfg)
    return Engine(cfg)


def _model_path(cfg: EngineConfig) -> str:
    return getattr(cfg, "model", None) or MODEL_PATH


def _server_args(cfg: EngineConfig, port: int) -> dict[str, Any]:
    return {
        "model_path": _model_path(cfg),
        "tokenizer_path": _model_path(cfg),
        "host": "127.0.0.1",
        "port": port,
        "dp_size": cfg.dp_size,
        "enable_dp_attention": cfg.dp_size > 1,
        "max_running_requests": cfg.max_running_requests,
        "random_seed": cfg.seed,
        "speculative_algorithm": "DSPARK" if getattr(cfg, "speculative", True) else None,
        "speculative_dspark_block_size": cfg.gamma,
        "speculative_num_draft_tokens": cfg.gamma + 1,
        # SGLang's flag: None = no table (its planner then runs the flat uninitialised table)
        "speculative_dspark_sps_table_path": cfg.sps_table_path if cfg.sps_table is not None else None,
        "speculative_dspark_confidence_sts_path": None,
        "enable_metrics": True,
        "log_requests": bool(cfg.request_log_path),
        "log_requests_format": "json" if cfg.request_log_path else "text",
        "log_requests_level": 3 if cfg.request_log_path else 2,
        "log_requests_target": [cfg.request_log_path] if cfg.request_log_path else None,
        "emulator": True,
        # what the emulator plans with: file (the path above) | builtin (its additive table) | none
        "emulator_sps_table": sps_table_source(cfg),
        # SGLang's record deque holds a fixed INFO_DUMP_MAX_RECORDS; the emulator's is configurable
        "emulator_max_records": cfg.max_records,
        # which clock e2e_latency and the step times come from: the cost table's (virtual) or measured (wall)
        "emulator_clock": "wall" if getattr(cfg, "model", None) else "virtual",
    }


def sps_table_source(cfg: EngineConfig) -> str:
    """``file`` | ``builtin`` | ``none``: the table the emulator's planner uses (``emulate --sps-table``)."""
    if cfg.sps_table is None:
        return "none"
    return "file" if cfg.sps_table_path else "builtin"


class EmulatorApp:
    """The Starlette app and the engine behind it."""

    def __init__(self, cfg: EngineConfig, *, port: int = 30000,
                 launch_command: Optional[str] = None, test_hooks: bool = False) -> None:
        self.cfg = cfg
        self.port = port
        self.engine = make_engine(cfg)
        self.model_path = _model_path(cfg)
        self.detokenize = getattr(self.engine, "detokenize", detokenize)
        self.startup_time = time.time()
        self.launch_command = launch_command or " ".join(sys.argv)
        self.env = {
            "SGLANG_RAGGED_VERIFY_MODE": cfg.mode,
            "SGLANG_DSPARK_DEBUG_DUMP": ",".join(sorted(cfg.components)),
            "SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS": str(cfg.lag_steps),
        }
        if cfg.estimate_path:
            self.env["SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH"] = cfg.estimate_path
            self.env["SGLANG_DSPARK_FOLDED_PROPOSAL"] = "0" if not cfg.folded_proposal else "1"
        hooks = [Route("/emulator/restart", self.restart, methods=["POST"])] if test_hooks else []
        self.app = Starlette(routes=hooks + [
            Route("/generate", self.generate, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
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
        if self.cfg.request_log_path:
            self._log_finished(str(rid), body, result)
        return Response(msgspec.json.encode(result), media_type="application/json")

    def _log_finished(self, rid: str, body: dict, result: dict) -> None:
        """One ``request.finished`` line as SGLang's JSON request log writes it (level 3: nothing cut).

        The file is opened per line, so a log rotated by renaming is recreated on the next request.
        """
        now = time.time()
        obj = {k: body[k] for k in ("text", "input_ids", "sampling_params", "return_logprob") if k in body}
        line = msgspec.json.encode({"timestamp": now, "event": "request.finished", "rid": rid,
                                    "obj": {**obj, "rid": rid}, "out": result}).decode()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(now))
        with open(self.cfg.request_log_path, "a", encoding="utf-8") as fh:
            fh.write(f"[{stamp}] {line}\n")

    # -- OpenAI-compatible endpoints (SGLang's serving_completions / serving_chat) --

    async def _openai(self, request: Request, *, chat: bool) -> tuple[Optional[dict], Any]:
        """Decode, validate and run an OpenAI request; returns (engine result, body) or an error response."""
        try:
            body = msgspec.json.decode(await request.body())
        except msgspec.DecodeError as exc:
            return None, JSONResponse({"object": "error", "message": f"invalid JSON: {exc}", "code": 400},
                                      status_code=400)
        if not isinstance(body, dict):
            return None, JSONResponse({"object": "error", "message": "body must be a JSON object", "code": 400},
                                      status_code=400)
        if body.get("stream") or int(body.get("n") or 1) != 1:
            return None, JSONResponse({"object": "error", "message": "the emulator serves stream=false, n=1 only",
                                       "code": 400}, status_code=400)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return None, JSONResponse({"object": "error", "message": "messages must be a non-empty list",
                                           "code": 400}, status_code=400)
            text = "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            input_ids = None
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
            top = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        else:
            prompt = body.get("prompt")
            text, input_ids = (prompt, None) if isinstance(prompt, str) else (None, prompt)
            if not prompt:
                return None, JSONResponse({"object": "error", "message": "Prompt cannot be empty", "code": 400},
                                          status_code=400)
            max_tokens = body.get("max_tokens", 16)
            top = body.get("logprobs")
        temperature = body.get("temperature")
        rid = body.get("rid") or f"{'chatcmpl' if chat else 'cmpl'}-{os.urandom(8).hex()}"
        try:
            req = GenerateRequest(
                rid=str(rid), text=text, input_ids=input_ids,
                temperature=1.0 if temperature is None else float(temperature),
                max_new_tokens=int(max_tokens or 128), sampling_seed=body.get("seed"),
                return_logprob=top is not None, top_logprobs_num=int(top or 0))
            fut = self.engine.submit(req)
        except (TypeError, ValueError) as exc:
            return None, JSONResponse({"object": "error", "message": str(exc), "code": 400}, status_code=400)
        return await asyncio.wrap_future(fut), body

    @staticmethod
    def _sglext(result: dict, body: dict) -> dict[str, Any]:
        meta = result["meta_info"]
        if not body.get("return_spec_tokens_details") or "spec_verify_ct" not in meta:
            return {}
        details = {  # SGLang's SpecTokensDetails: absent counters read 0 / []
            "spec_accept_rate": meta.get("spec_accept_rate") or 0.0,
            "spec_accept_length": meta.get("spec_accept_length") or 0.0,
            "spec_cap_length": meta.get("spec_cap_length") or 0.0,
            "spec_block_accept_length": meta.get("spec_block_accept_length") or 0.0,
            "spec_num_correct_drafts": meta.get("spec_num_correct_drafts") or 0,
            "spec_num_proposed_drafts": meta.get("spec_num_proposed_drafts") or 0,
            "spec_verify_ct": meta.get("spec_verify_ct") or 0,
            "spec_correct_drafts_histogram": meta.get("spec_correct_drafts_histogram") or [],
            "spec_cap_lens_histogram": meta.get("spec_cap_lens_histogram") or [],
        }
        return {"sglext": {"spec_tokens_details": details}}

    @staticmethod
    def _usage(meta: dict) -> dict[str, Any]:
        return {"prompt_tokens": meta["prompt_tokens"], "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                "completion_tokens": meta["completion_tokens"], "prompt_tokens_details": None,
                "reasoning_tokens": 0, "completion_tokens_details": None}

    async def completions(self, request: Request) -> Response:
        result, body = await self._openai(request, chat=False)
        if result is None:
            return body
        meta, fr = result["meta_info"], result["meta_info"]["finish_reason"]
        logprobs = None
        if body.get("logprobs") is not None:
            lps = meta.get("output_token_logprobs") or []
            tops = meta.get("output_top_logprobs") or []
            logprobs = {"text_offset": [-1] * len(lps), "token_logprobs": [e[0] for e in lps],
                        "tokens": [self.detokenize([e[1]]) for e in lps],
                        "top_logprobs": [{self.detokenize([t[1]]): t[0] for t in top} for top in tops]}
        choice = {"index": 0, "text": result["text"], "logprobs": logprobs, "finish_reason": fr["type"],
                  "matched_stop": fr.get("matched")}
        if body.get("return_token_ids"):
            choice["token_ids"] = result["output_ids"]
        return self._openai_response("text_completion", choice, result, body)

    def _openai_response(self, kind: str, choice: dict[str, Any], result: dict[str, Any], body: dict) -> Response:
        """An OpenAI-style response object of ``kind`` with its one choice, usage and SGLang's extras."""
        meta = result["meta_info"]
        resp = {"id": meta["id"], "object": kind, "created": int(time.time()),
                "model": body.get("model") or self.model_path, "choices": [choice], "usage": self._usage(meta),
                "metadata": None, **self._sglext(result, body)}
        return Response(msgspec.json.encode(resp), media_type="application/json")

    async def chat_completions(self, request: Request) -> Response:
        result, body = await self._openai(request, chat=True)
        if result is None:
            return body
        meta, fr = result["meta_info"], result["meta_info"]["finish_reason"]
        logprobs = None
        if body.get("logprobs"):
            tops = meta.get("output_top_logprobs") or []

            def entry(tok: str, lp: float) -> dict[str, Any]:
                return {"token": tok, "bytes": list(tok.encode()), "logprob": lp}

            logprobs = {"content": [
                {**entry(self.detokenize([e[1]]), e[0]),
                 "top_logprobs": [entry(self.detokenize([t[1]]), t[0]) for t in (tops[i] if i < len(tops) else [])]}
                for i, e in enumerate(meta.get("output_token_logprobs") or [])]}
        choice = {"index": 0, "message": {"role": "assistant", "content": result["text"],
                                          "reasoning_content": None, "tool_calls": None},
                  "logprobs": logprobs, "finish_reason": fr["type"], "matched_stop": fr.get("matched")}
        if body.get("return_token_ids"):
            choice["response_token_ids"] = result["output_ids"]
        return self._openai_response("chat.completion", choice, result, body)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_path, "object": "model", "created": int(self.startup_time), "owned_by": "sglang",
             "root": self.model_path, "max_model_len": 131072}]})

    async def restart(self, request: Request) -> Response:
        """Test hook: a server restart in place (new startup_time, forward_ct from 0, empty deques)."""
        old = self.engine
        old.stop()
        self.engine = make_engine(self.cfg)
        self.engine.start()
        self.startup_time = time.time()
        return JSONResponse({"restarted": True, "startup_time": self.startup_time})

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
        unknown = [k for k in args if k not in ("dspark_clear_info_records", "dspark_force_budget_frac",
                                                "emulator_lockstep_concurrency", "emulator_lockstep_total")]
        if unknown:
            return JSONResponse({"updated": False})
        if "emulator_lockstep_concurrency" in args:  # emulator only: a sweep point's closed-loop batch
            self.engine.set_lockstep(int(args["emulator_lockstep_concurrency"] or 0),
                                     int(args.get("emulator_lockstep_total") or 0))
        if "dspark_force_budget_frac" in args:

            frac = args["dspark_force_budget_frac"]
            try:
                frac = None if frac is None else float(frac)
                check_force_budget_frac(frac)
            except (TypeError, ValueError) as exc:
                return JSONResponse({"updated": False, "error": str(exc)}, status_code=400)
            with self.engine.lock:
                self.engine.cfg.force_budget_frac = frac
        if args.get("dspark_clear_info_records"):
            self.engine.clear_records()
        return JSONResponse({"updated": True})

    async def metrics(self, request: Request) -> Response:
        gauges = self.engine.spec_gauges()
        labels = f'model_name="{self.model_path}",engine_type="unified"'
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
        return JSONResponse({"model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True})


class BackgroundServer:
    """Run the emulator in this process on a background thread (tests, demo)."""

    def __init__(self, cfg: EngineConfig, *, host: str = "127.0.0.1", port: int = 0,
                 test_hooks: bool = False) -> None:
        self.cfg, self.host = cfg, host
        self.test_hooks = test_hooks
        self._requested_port = port
        self.emulator: Optional[EmulatorApp] = None
        self._server: Optional[uvicorn.Server] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "BackgroundServer":

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._requested_port))
        self.port = sock.getsockname()[1]
        self.emulator = EmulatorApp(self.cfg, port=self.port, launch_command="dspark-obs emulate",
                                    test_hooks=self.test_hooks)
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


_FALSE = ("0", "false", "no", "off", "")


def config_from_env(cfg: EngineConfig, environ: Mapping[str, str]) -> EngineConfig:
    """``cfg`` with what SGLang reads from its environment applied.

    ``SGLANG_DSPARK_DEBUG_DUMP`` (components, or ``all``; when set),
    ``SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS``,
    ``SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`` and
    ``SGLANG_DSPARK_FOLDED_PROPOSAL`` (default on: no estimator rows).  The
    mode (``SGLANG_RAGGED_VERIFY_MODE``) is read by ``dspark-obs emulate`` when
    ``--mode`` is not given.
    """
    changes: dict[str, Any] = {}
    dump = environ.get("SGLANG_DSPARK_DEBUG_DUMP")
    if dump is not None:
        tokens = {t.strip() for t in dump.split(",") if t.strip()}
        changes["components"] = ALL_COMPONENTS if "all" in tokens else frozenset(tokens)
    lag = environ.get("SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS")
    if lag:
        changes["lag_steps"] = int(lag)
    path = environ.get("SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH")
    if path:
        changes["estimate_path"] = path
        changes["folded_proposal"] = environ.get("SGLANG_DSPARK_FOLDED_PROPOSAL", "1").strip().lower() not in _FALSE
    return dataclasses.replace(cfg, **changes) if changes else cfg


def serve(cfg: EngineConfig, *, host: str = "127.0.0.1", port: int = 30000,
          environ: Optional[Mapping[str, str]] = None) -> None:
    """Serve in the foreground until interrupted (``dspark-obs emulate``)."""
    environ = os.environ if environ is None else environ
    cfg = config_from_env(cfg, environ)
    hooks = environ.get("DSPARK_OBS_EMULATOR_TEST_HOOKS", "").strip().lower() not in _FALSE
    emulator = EmulatorApp(cfg, port=port, test_hooks=hooks)
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
