"""A concurrency sweep as a first-class run set: the write-up's Fig. 1 and Fig. 3 for real.

Every point of a sweep — one method, one workload, one driver concurrency —
is its own run, collected the ordinary way (:func:`collectors.sglang.session.collect`)
with ``sweep_id``, ``method`` and ``concurrency`` on its ``runs`` row.  The
methods differ only in speculation:

* ``no-spec`` — the target alone, one token per request per step;
* ``fixed-window`` — the MTP kind: the whole block (gamma + 1 slots) verified every step (``static``);
* ``compact`` — DSpark: the scheduler's ragged per-request windows;
* ``no-trim`` — DSpark's ragged path with the budget forced to the full block
  (SGLang's ``/set_internal_state`` ``dspark_force_budget_frac = 1.0``), as the write-up defines it.

On the embedded emulator each method gets a server of its own (same seed, same
cost model).  Against real servers, each method is driven on the server it is
given (``servers``: method -> URL; methods differ by how the server was launched,
e.g. ``SGLANG_RAGGED_VERIFY_MODE=static`` for fixed-window), or all on one
``url``; ``no-trim`` sets the forced budget on its server and clears it after.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Callable, Optional

METHODS = ("no-spec", "fixed-window", "compact", "no-trim")
# How the emulator serves each method (options of `dspark-obs emulate`).
EMULATOR_OPTIONS: dict[str, dict[str, Any]] = {
    "no-spec": {"mode": "compact", "no_speculation": True},
    "fixed-window": {"mode": "static"},
    "compact": {"mode": "compact"},
    "no-trim": {"mode": "compact", "force_budget_frac": 1.0},
}
# The server mode a method needs on a real server (no-spec needs a server without DSpark).
REAL_SERVER_MODE = {"fixed-window": "static", "compact": "compact", "no-trim": "compact"}
FULL_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_CONCURRENCY = (1, 2, 4, 16, 64, 128)
# How long the emulator holds a forward for a refill that is late (it knows when none is due).
LOCKSTEP_WAIT_S = 2.0
# Two workloads that differ in acceptance: gsm8k drafts are easy, poetry's hard.
WORKLOADS = ("gsm8k", "poetry")


class SweepError(ValueError):
    """A sweep that cannot run as asked (the message says what to change)."""


@dataclasses.dataclass
class SweepOptions:
    sweep_id: str
    methods: tuple[str, ...] = METHODS
    concurrency: tuple[int, ...] = FULL_CONCURRENCY
    workloads: tuple[str, ...] = WORKLOADS
    requests_per_slot: int = 2  # requests per point = max(min_requests, requests_per_slot * concurrency)
    min_requests: int = 16
    max_new_tokens: int = 192
    temperature: float = 0.7
    seed: int = 0
    url: Optional[str] = None  # one real server for every method: drive it instead of starting emulators
    servers: dict[str, str] = dataclasses.field(default_factory=dict)  # method -> its real server's URL

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise SweepError(f"methods {unknown or '(none)'} are not among {', '.join(METHODS)}")
        if not self.concurrency or min(self.concurrency) < 1:
            raise SweepError(f"concurrency must be integers >= 1, got {list(self.concurrency)}")
        if not self.workloads:
            raise SweepError("at least one workload is needed, e.g. gsm8k,poetry")
        stray = [m for m in self.servers if m not in METHODS]
        if stray:
            raise SweepError(f"--server {stray[0]}=...: {stray[0]!r} is not a method; methods: {', '.join(METHODS)}")
        if self.servers:
            missing = [m for m in self.methods if m not in self.servers and not self.url]
            if missing:
                raise SweepError(f"no server for method {', '.join(missing)}: give --server {missing[0]}=URL for "
                                 f"each method swept (or --url for all), or leave it out of --method")
        if (self.url or self.servers) and "no-spec" in self.methods:
            raise SweepError("no-spec on a real server needs a server without DSpark, which exposes no "
                             "dspark_info_record to collect from: sweep it on the emulator, or leave no-spec "
                             "out of --method for --url")

    @classmethod
    def quick(cls, sweep_id: str, **changes: Any) -> "SweepOptions":
        """The CI-sized sweep: 6 concurrencies x 4 methods x 2 workloads of short requests."""
        base = dict(concurrency=QUICK_CONCURRENCY, requests_per_slot=2, min_requests=8, max_new_tokens=64)
        return cls(sweep_id, **{**base, **changes})

    def server_of(self, method: str) -> Optional[str]:
        """The real server a method is driven on (None: the emulator)."""
        return self.servers.get(method) or self.url

    def requests_at(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_slot * concurrency)


@dataclasses.dataclass(frozen=True)
class SweepPoint:
    method: str
    workload: str
    concurrency: int

    def run_id(self, sweep_id: str) -> str:
        return f"{sweep_id}-{self.method}-{self.workload}-c{self.concurrency:03d}"


def points(opts: SweepOptions) -> list[SweepPoint]:
    """Every point of the sweep, method by method (one server each on the emulator)."""
    return [SweepPoint(m, w, c) for m in opts.methods for w in opts.workloads for c in sorted(set(opts.concurrency))]


def default_sweep_id(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"sweep-{now:%Y%m%dT%H%M%S}"


def run_sweep(store, opts: SweepOptions, *, on_point: Callable[[SweepPoint, Any], None] = lambda p, s: None
              ) -> list[str]:
    """Collect every point of ``opts`` into ``store``; the run ids, in order.

    A re-run of the same ``sweep_id`` replaces its own runs.
    """
    # at call time: the CLI imports this module to declare the sweep's options
    from dspark_obs.emulator.subprocess_server import SubprocessServer

    run_ids = []
    for method in opts.methods:
        mine = [p for p in points(opts) if p.method == method]
        if opts.server_of(method) is not None:
            run_ids += _drive_real(store, opts, mine, opts.server_of(method), on_point)
            continue
        with SubprocessServer(seed=opts.seed, lockstep_wait_s=LOCKSTEP_WAIT_S, **EMULATOR_OPTIONS[method]) as server:
            for point in mine:
                _set_emulator_lockstep(server.url, point.concurrency, opts.requests_at(point.concurrency))
                run_ids.append(_collect_point(store, opts, point, server.url, on_point))
    return run_ids


def run_sweep_with_progress(store, opts: SweepOptions, *, console) -> list[str]:
    """:func:`run_sweep` with a progress bar over its points (``dspark-obs sweep``, ``demo --sweep``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # at call time: the CLI imports this module to declare its options

    total = len(points(opts))
    with Progress(TextColumn("{task.description}"), BarColumn(bar_width=20), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task(f"sweep {opts.sweep_id}", total=total)

        def done(point, summary) -> None:
            bar.update(task, advance=1, description=f"{point.method} {point.workload} c={point.concurrency}")

        return run_sweep(store, opts, on_point=done)


def _drive_real(store, opts: SweepOptions, mine: list[SweepPoint], url: str, on_point) -> list[str]:
    """A real server's points: the forced budget for no-trim, cleared afterwards whatever happens."""
    # at call time: the CLI imports this module to declare the sweep's options
    from collectors.sglang.companion import CompanionError, check_server

    method = mine[0].method
    try:
        mode = check_server(url).mode
    except CompanionError as exc:
        raise SweepError(str(exc).replace(", and SGLANG_RAGGED_VERIFY_MODE=cap-accept for a companion", "")) from exc
    if mode and mode != REAL_SERVER_MODE[method]:
        raise SweepError(f"{url} runs SGLANG_RAGGED_VERIFY_MODE={mode}; method {method} needs "
                         f"{REAL_SERVER_MODE[method]}: give --server {method}=URL of a server launched for it")
    forced = method == "no-trim"
    if forced:
        _force_budget(url, 1.0)
    try:
        return [_collect_point(store, opts, p, url, on_point) for p in mine]
    finally:
        if forced:
            _force_budget(url, None)


def _set_emulator_lockstep(url: str, concurrency: int, total: int) -> None:
    """Hold the emulator's forwards until the client has refilled: the batch is the point's concurrency."""
    # at call time: the CLI imports this module to declare the sweep's options
    import httpx

    args = {"emulator_lockstep_concurrency": concurrency, "emulator_lockstep_total": total}
    httpx.post(f"{url}/set_internal_state", json={"server_args": args}, timeout=10.0).raise_for_status()


def _force_budget(url: str, frac: Optional[float]) -> None:
    # at call time: the CLI imports this module to declare the sweep's options
    import httpx

    resp = httpx.post(f"{url}/set_internal_state", json={"server_args": {"dspark_force_budget_frac": frac}},
                      timeout=10.0)
    if resp.status_code != 200 or not resp.json().get("updated", False):
        raise SweepError(f"{url} refused dspark_force_budget_frac={frac}: {resp.text[:300]} "
                         "(no-trim needs SGLang's forced budget; sweep the other methods without it)")


def _collect_point(store, opts: SweepOptions, point: SweepPoint, url: str, on_point) -> str:
    # at call time: the CLI imports this module to declare the sweep's options
    from collectors.sglang.driver import DriveSpec
    from collectors.sglang.session import CollectOptions, collect

    run_id = point.run_id(opts.sweep_id)
    store.drop_run_everywhere(run_id)
    spec = DriveSpec([point.workload], opts.requests_at(point.concurrency), concurrency=point.concurrency,
                     temperature=opts.temperature, max_new_tokens=opts.max_new_tokens, top_logprobs=0,
                     seed=opts.seed)
    summary = collect(store, CollectOptions(
        url=url, run_id=run_id, poll_interval=0.25, flush_interval=2.0, drive=spec,
        labels={"sweep": opts.sweep_id, "method": point.method}, sweep_id=opts.sweep_id, method=point.method))
    on_point(point, summary)
    return run_id
