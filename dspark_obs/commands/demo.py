"""``dspark-obs demo``: the option checks in front of :func:`dspark_obs.demo.run_demo`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dspark_obs.console import console, fail as _fail, in_range
from dspark_obs.console import FORMAT_HELP, check_format


def demo(
    out: Path = typer.Option(Path("demo-data"), help="Data root to write the demo's runs to (a directory)."),
    quick: bool = typer.Option(False, help="Fewer requests: finishes in well under a minute."),
    serve: bool = typer.Option(False, "--serve", help="Serve the dashboard at the end, in the foreground (Ctrl-C to stop). Default: print the command that opens it and exit."),
    no_dashboard: bool = typer.Option(False, "--no-dashboard", hidden=True, help="The default now (kept for old scripts)."),
    seed: int = typer.Option(0, callback=in_range(0), help="Seed of the emulator and the traffic."),
    model: Optional[str] = typer.Option(None, help="Run the demo on a real model (smollm2-135m; see `emulate --model`) with real prompts."),
    format: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP + "; csv/json go to stdout, the rest to stderr"),
    sweep: bool = typer.Option(False, "--sweep", help="Also sweep concurrency for no-spec, fixed-window, compact and no-trim (dspark-obs sweep; with --quick its CI-sized form), so the dashboard and the report draw Fig. 1 and Fig. 3."),
) -> None:
    """Emulate a DSpark server, collect a compact run and its cap-accept companion, summarise, and exit.

    Everything runs locally on the embedded emulator; nothing needs a GPU. It ends with the
    command that opens the dashboard (`dspark-obs dashboard --data OUT`); `--serve` runs it.
    """
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs.demo import run_demo

    check_format(format)
    if serve and no_dashboard:
        _fail("--serve and --no-dashboard contradict each other; give one (the default does not serve)")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; the demo writes a store directory: give a new or existing "
              f"directory, e.g. --out demo-data")
    if model is not None:
        # at call time: the CLI imports every command module to declare its options
        from dspark_obs.emulator.realmodel import weights

        if model != weights.MODEL_NAME:
            _fail(f"--model {model!r} is not known; available: {weights.MODEL_NAME}")
        try:
            weights.require_extra()
        except weights.ModelExtraMissing as exc:
            _fail(str(exc))
    try:
        if sweep and model is not None:
            _fail("--sweep runs on the stochastic emulator; leave out --model")
        run_demo(out, quick=quick, seed=seed, serve_dashboard=serve, console=console, model=model, fmt=format,
                 sweep=sweep)
    except Exception as exc:
        _fail(f"demo failed: {exc}", code=1)


def register(app: typer.Typer) -> None:
    app.command()(demo)
