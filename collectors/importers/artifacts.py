"""Cost tables, SPS profiler outputs and STS calibrations -> ``cost_tables``, ``sps_records``/``sps_rounds``, ``sts_calibrations``.

Formats are SGLang 0.5.23's:

* cost table (``--speculative-dspark-sps-table-path``): ``SpsCostTable``
  ``{sample_batch_tokens, sample_steps_per_sec, max_batch_tokens}`` or
  ``SpsAdditiveCostTable`` ``{bias_seconds, bs_probes, alpha_seconds, m_probes,
  theta_seconds}``, told apart as SGLang's loader does (``"bias_seconds"`` in
  the text) and checked with the same invariants (:mod:`dspark_obs.costtable`
  declares both);
* profiler (``benchmark/dspark_sps_profiler.py``): ``<stem>.records.jsonl``
  rows ``{repeat, batch_size, batch_size_per_rank, dp_rank, forward_ct,
  num_running_reqs, num_verify_tokens, step_time}``, ``<stem>.rounds.jsonl``
  rows ``{repeat, batch_size, batch_size_per_rank, frac, batch_tokens,
  steps_per_sec, num_steady_steps, match_fraction, per_rank_median_step_time,
  load_info}``, and ``<out>.manifest.json`` (its ``round_summaries``); the
  kind of each line is told by its keys;
* STS calibration (``--speculative-dspark-confidence-sts-path``):
  ``DSparkStsCalibration`` ``{temperatures, dataset, num_samples, ece_before,
  ece_after}`` with every temperature finite and > 0 (:mod:`dspark_obs.sts_format`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import msgspec

from collectors.importers import ImportResult, TableSink, iter_json_documents, now
from dspark_obs import costtable
from dspark_obs.sts_format import StsCalibration


def _read_text(path: str | Path) -> str:
    return Path(path).read_bytes().decode("utf-8", "replace")


def import_cost_table(store, run_id: str, path: str | Path) -> ImportResult:
    result = ImportResult("sps-table")
    sink = TableSink(store, run_id, result)
    text = _read_text(path)
    try:
        table = costtable.from_json(text)
    except ValueError as exc:
        sink.dead(f"sps-table:{Path(path).name}", str(exc), text)
    else:
        kind = "additive" if isinstance(table, costtable.SpsAdditiveCostTable) else "1d"
        sink.add("cost_tables", {"kind": kind, **msgspec.structs.asdict(table), "path": str(path),
                                 "raw_json": text[:1_000_000], "imported_at": now()})
    sink.close()
    return result


def _num(d: dict, key: str, kind: type = float) -> Optional[float]:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not isinstance(v, int)):
        raise ValueError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
    return v


def _sps_record(d: dict, line: int) -> dict:
    if not isinstance(d.get("step_time"), (int, float)) or isinstance(d.get("step_time"), bool):
        raise ValueError(f"step_time must be a number, got {d.get('step_time')!r}")
    return {"repeat": _num(d, "repeat", int), "batch_size": _num(d, "batch_size", int),
            "batch_size_per_rank": _num(d, "batch_size_per_rank", int), "dp_rank": _num(d, "dp_rank", int),
            "forward_ct": _num(d, "forward_ct", int), "num_running_reqs": _num(d, "num_running_reqs", int),
            "num_verify_tokens": _num(d, "num_verify_tokens", int), "step_time_s": float(d["step_time"]),
            "source_line": line}


def _sps_round(d: dict, line: int) -> dict:
    load = d.get("load_info") if isinstance(d.get("load_info"), dict) else {}
    med = d.get("per_rank_median_step_time")
    if med is not None and (not isinstance(med, list) or not all(isinstance(v, (int, float)) for v in med)):
        raise ValueError(f"per_rank_median_step_time must be a list of numbers, got {str(med)[:80]}")
    reached = load.get("reached_target")
    return {"repeat": _num(d, "repeat", int), "batch_size": _num(d, "batch_size", int),
            "batch_size_per_rank": _num(d, "batch_size_per_rank", int), "frac": _num(d, "frac"),
            "batch_tokens": _num(d, "batch_tokens", int), "steps_per_sec": _num(d, "steps_per_sec"),
            "num_steady_steps": _num(d, "num_steady_steps", int), "match_fraction": _num(d, "match_fraction"),
            "per_rank_median_step_time_s": med, "load_num_requests": _num(load, "num_requests", int),
            "load_max_new_tokens": _num(load, "max_new_tokens", int),
            "load_wall_seconds": _num(load, "wall_seconds"),
            "load_reached_target": reached if isinstance(reached, bool) else None, "source_line": line}


def import_sps_records(store, run_id: str, path: str | Path) -> ImportResult:
    """Profiler ``.records.jsonl`` / ``.rounds.jsonl`` lines, or a ``.manifest.json``'s round summaries."""
    result = ImportResult("sps-records")
    sink = TableSink(store, run_id, result)
    source = f"sps-records:{Path(path).name}"
    for line, value, error, text in iter_json_documents(path):
        try:
            if error is not None:
                raise ValueError(error)
            if not isinstance(value, dict):
                raise ValueError(f"expected a JSON object, got {type(value).__name__}")
            if "round_summaries" in value:  # the manifest
                summaries = value["round_summaries"]
                if not isinstance(summaries, list):
                    raise ValueError("manifest round_summaries must be a list")
                for s in summaries:
                    sink.add("sps_rounds", _sps_round(s if isinstance(s, dict) else {}, line))
            elif "step_time" in value:
                sink.add("sps_records", _sps_record(value, line))
            elif "steps_per_sec" in value:
                sink.add("sps_rounds", _sps_round(value, line))
            else:
                raise ValueError("neither a profiler record (step_time) nor a round (steps_per_sec)")
        except (ValueError, TypeError) as exc:
            sink.dead(f"{source}:{line}", str(exc), text)
    sink.close()
    return result


def import_sts(store, run_id: str, path: str | Path) -> ImportResult:
    result = ImportResult("sts")
    sink = TableSink(store, run_id, result)
    if str(path).endswith(".pt"):
        sink.dead(f"sts:{Path(path).name}", "an STS collection shard (.pt, torch) is not a calibration JSON; "
                  "fit temperatures first (dspark-obs calibrate) and pass the JSON", None)
        sink.close()
        return result
    text = _read_text(path)
    try:
        c = StsCalibration.from_json(text)
    except ValueError as exc:
        sink.dead(f"sts:{Path(path).name}", str(exc), text)
    else:
        sink.add("sts_calibrations", {"path": str(path), "temperatures": c.temperatures, "dataset": c.dataset,
                                      "num_samples": c.num_samples, "ece_before": c.ece_before,
                                      "ece_after": c.ece_after, "raw_json": text[:1_000_000],
                                      "imported_at": now()})
    sink.close()
    return result
