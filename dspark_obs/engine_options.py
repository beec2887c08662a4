"""The options every estimator command shares to run on Ray: ``--engine``, ``--ray-address``, ``--ray-workers``.

Declared once here and used as the defaults of ``estimate``, ``calibrate`` and
``report``, so the three say the same thing and check it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import typer

from dspark_obs.console import fail

__all__ = ["ENGINE", "RAY_ADDRESS", "RAY_WORKERS", "DATA_ROOT_HELP", "engine_for", "data_root"]

ENGINE = typer.Option("local", "--engine", help="local: this process | ray: the run's requests split by rid hash "
                      "into Ray tasks that run the same per-chunk code; same tables (pip install 'dspark-obs[ray]').")
RAY_ADDRESS = typer.Option(None, "--ray-address", help="With --engine ray: the cluster to run on (ray://head:10001, "
                           "or the host:port `ray start --head` printed). Default: a local Ray on this machine.")
RAY_WORKERS = typer.Option(None, "--ray-workers", min=1, help="With --engine ray and no --ray-address: CPUs of "
                           "the local Ray, one task each (default: all cores).")
DATA_ROOT_HELP = ("Data root of the store: a directory (from `dspark-obs collect` or `demo`) or an object-store URL "
                  "(s3://bucket/prefix?endpoint_override=host:port&scheme=http).")


def engine_for(engine: str, address: Optional[str], workers: Optional[int]):
    """The :class:`~dspark_obs.ray_engine.RayEngine` the options ask for, started; None for ``local``."""
    from dspark_obs.ray_engine import ENGINES, RayEngine, RayUnavailable

    if engine not in ENGINES:
        fail(f"--engine {engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "local":
        if address is not None or workers is not None:
            fail("--ray-address and --ray-workers need --engine ray")
        return None
    if address is not None and workers is not None:
        fail("--ray-workers sizes a local Ray; with --ray-address the cluster's CPUs decide: give one")
    try:
        return RayEngine(address=address, workers=workers).start()
    except RayUnavailable as exc:
        fail(str(exc))


def data_root(data: str) -> Union[str, Path]:
    """``--data`` as the store's root: an object-store URL as given, else an existing directory."""
    from dspark_obs.objstore import is_url

    if is_url(data):
        return data
    path = Path(data)
    if not path.is_dir():
        fail(f"--data {data} is not a directory; collect a run first (dspark-obs demo or dspark-obs collect)")
    return path
