"""``dspark-obs sweep``: every method at every concurrency, each point its own run (Fig. 1 and Fig. 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a comma-separated list of integers, e.g. 1,4,16,64") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{text!r}: give integers >= 1, e.g. 1,2,4,8,16,32,64,128,256")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _servers(values: list[str]) -> dict[str, str]:
    """``--server METHOD=URL`` values as {method: url}."""
    out: dict[str, str] = {}
    for value in values:
        method, sep, url = value.partition("=")
        if not sep or not method.strip() or not url.strip().startswith(("http://", "https://")):
            raise typer.BadParameter(f"{value!r}: give METHOD=URL, e.g. --server compact=http://127.0.0.1:30000",
                                     param_hint="--server")
        if method.strip() in out:
            raise typer.BadParameter(f"{method.strip()} is given twice", param_hint="--server")
        out[method.strip()] = url.strip().rstrip("/")
    return out


def register(app: typer.Typer) -> None:
    # at call time: the CLI imports every command module to declare its options
    from dspark_obs import sweep

    @app.command("sweep")
    def sweep_command(
        out: Path = typer.Option(..., help="Data root to write the sweep's runs to (a directory)."),
        sweep_id: Optional[str] = typer.Option(None, help="Sweep id (default: sweep-YYYYmmddTHHMMSS, UTC); "
                                                          "a re-run of the same id replaces its runs."),
        quick: bool = typer.Option(False, help="The CI-sized sweep: concurrency 1,2,4,16,64,128, short requests."),
        method: str = typer.Option(",".join(sweep.METHODS), help="Comma-separated methods: " + ", ".join(sweep.METHODS) + "."),
        concurrency: Optional[str] = typer.Option(None, help="Comma-separated driver concurrencies (default 1,2,4,...,256; --quick: 1,2,4,16,64,128)."),
        workload: str = typer.Option(",".join(sweep.WORKLOADS), help="Comma-separated workloads, one run per point each (default: gsm8k,poetry, high and low acceptance)."),
        max_new_tokens: Optional[int] = typer.Option(None, min=1, help="Output limit per request (default 192; --quick: 64)."),
        temperature: float = typer.Option(0.7, min=0.0, help="Sampling temperature of the traffic (0 = greedy)."),
        seed: int = typer.Option(0, min=0, help="Seed of the emulators and the traffic."),
        url: Optional[str] = typer.Option(None, help="Drive this one real server for every method instead of the emulator (no-trim sets dspark_force_budget_frac=1.0 and clears it after)."),
        server: list[str] = typer.Option([], "--server", metavar="METHOD=URL", help="A real server for one method, repeatable: methods differ by how the server was launched, e.g. --server compact=http://h:30000 --server fixed-window=http://h:30001 (SGLANG_RAGGED_VERIFY_MODE=static). Without --method, the methods given here are swept."),
    ) -> None:
        """Sweep driver concurrency for each speculation method; each point is its own run.

        Methods: no-spec (target alone), fixed-window (the whole block every step, MTP kind),
        compact (DSpark's trimmed windows) and no-trim (DSpark's ragged path, full blocks).
        On the emulator each method runs on its own server (same seed and cost model); the
        runs carry sweep_id, method and concurrency, and the dashboard's Throughput page and
        the report draw them as Fig. 1 and Fig. 3.

        Example: `dspark-obs sweep --out data --quick`; against real servers:
        `dspark-obs sweep --out data --server compact=http://h:30000 --server no-trim=http://h:30000
        --server fixed-window=http://h:30001`
        """
        # at call time: the CLI imports every command module to declare its options
        from dspark_obs.console import console, fail as _fail
        from dspark_obs.store import Store

        conc = _ints(concurrency) if concurrency else None
        servers = _servers(server)
        methods = _names(method)
        if servers and method == ",".join(sweep.METHODS):  # --method not given: sweep the servers' methods
            methods = tuple(m for m in sweep.METHODS if m in servers) + tuple(m for m in servers
                                                                              if m not in sweep.METHODS)
        changes = {k: v for k, v in dict(methods=methods, workloads=_names(workload), temperature=temperature,
                                        seed=seed, url=url, servers=servers, max_new_tokens=max_new_tokens,
                                        concurrency=conc).items() if v is not None}
        sid = sweep_id or sweep.default_sweep_id()
        try:
            opts = sweep.SweepOptions.quick(sid, **changes) if quick else sweep.SweepOptions(sid, **changes)
        except sweep.SweepError as exc:
            _fail(str(exc))
        if out.exists() and not out.is_dir():
            _fail(f"--out {out} is a file; give a store directory, e.g. --out data")
        try:
            runs = sweep.run_sweep_with_progress(Store(out), opts, console=console)
        except sweep.SweepError as exc:
            _fail(str(exc), code=1)
        console.print(f"sweep {sid}: {len(runs)} runs in {out}. See them: dspark-obs dashboard --data {out} "
                      f"(Throughput page), or dspark-obs sql --data {out} sweep_points", soft_wrap=True)
