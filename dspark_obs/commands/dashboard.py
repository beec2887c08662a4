"""``dspark-obs dashboard``: the option checks in front of :func:`dspark_obs.ui.serve.serve_dashboard`."""

from __future__ import annotations

from pathlib import Path

import typer

from dspark_obs.console import in_range


def dashboard(
    data: Path = typer.Option(..., help="Data root of the store (from `dspark-obs collect` or `demo`)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; keep loopback unless you mean to expose it."),
    port: int = typer.Option(8501, callback=in_range(1, 65535), help="Port to serve on (1-65535)."),
) -> None:
    """Serve the Streamlit dashboard: ceiling, calibration, windows, cost model, throughput, requests, SQL.

    Headless (no browser is opened) and without Streamlit's usage statistics.  The pages
    read the store through read-only DuckDB views, cached per store version, so the
    dashboard can stay open while a collector writes.

    Example: `dspark-obs dashboard --data demo-data --port 8501`, then open http://127.0.0.1:8501
    """
    from dspark_obs.ui.serve import serve_dashboard  # start-up: the CLI loads every command module

    try:
        code = serve_dashboard(data, host, port)
    except ValueError as exc:
        # at call time: the CLI imports every command module to declare its options
        from dspark_obs.console import fail

        fail(str(exc))
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
