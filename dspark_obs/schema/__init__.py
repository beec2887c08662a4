"""Every Arrow schema of the store, once.

Each table is hive-partitioned by ``run_id`` (``<root>/<table>/run_id=<id>/``),
so ``run_id`` is a partition column and is not repeated inside the files.
SGLang omits record fields equal to their default; the store writes what the
server meant: ``-1`` for absent integer counters (SGLang's own default) and
null for absent optional values.  Columns documented here appear in the README.

Bump ``SCHEMA_VERSION`` when a column changes meaning or type; it is written
into every file's metadata (``dspark_obs.schema_version``).
"""

from __future__ import annotations

import pyarrow as pa

from dspark_obs.schema.columns import F32, F64, I16, I32, I64, STR, TS, field
from dspark_obs.schema.results import (
    CALIBRATION,
    CALIBRATION_BINS,
    CALIBRATION_RESAMPLES,
    CEILING,
    CEILING_SUMMARY,
    CEILING_VALIDATION,
    COMPANION_PAIRING,
    COMPANION_PAIRING_SUMMARY,
    COSTMODEL_ERROR,
    COSTMODEL_FIT,
    RECALIBRATION,
    REPLAY_CONFORMANCE,
    REPLAY_WHATIF,
    REPORTS,
    RESULT_TABLES,
)

__all__ = ["SCHEMA_VERSION", "METADATA_KEY", "field", "STORE_TABLES", "RESULT_TABLES", "TABLES", "schema_for",
           "data_model_markdown", "RUNS", "STEPS", "STEP_REQS", "REQUESTS", "TOKENS", "GAPS", "DEAD_LETTERS",
           "ESTIMATOR_RECORDS", "COST_TABLES", "STS_CALIBRATIONS", "SPS_RECORDS", "SPS_ROUNDS", "SAMPLING_OVERRIDES",
           "CEILING", "CEILING_SUMMARY", "CEILING_VALIDATION", "CALIBRATION", "CALIBRATION_BINS", "CALIBRATION_RESAMPLES",
           "RECALIBRATION",
           "COSTMODEL_FIT", "COSTMODEL_ERROR", "REPLAY_CONFORMANCE", "REPLAY_WHATIF", "COMPANION_PAIRING",
           "COMPANION_PAIRING_SUMMARY", "REPORTS"]

SCHEMA_VERSION = "1"
METADATA_KEY = b"dspark_obs.schema_version"


RUNS = pa.schema([
    field("started_at", TS, "when collection started (UTC)", False),
    field("ended_at", TS, "when collection ended; null while running"),
    field("source", STR, "emulator | sglang | import", False),
    field("server_url", STR, "base URL of the server; null for imports"),
    field("mode", STR, "static | compact | cap-accept (SGLANG_RAGGED_VERIFY_MODE)"),
    field("gamma", I32, "draft block size (drafts per step)"),
    field("dp_size", I32, "number of DP ranks (payloads per /server_info)"),
    field("labels", pa.map_(STR, STR), "free-form key/value labels (workloads, seed, ...)"),
    field("companion_of", STR, "run_id of the compact run this cap-accept run replays"),
    field("seed", I64, "emulator or driver seed, when known"),
    field("server_version", STR, "server's reported version"),
    field("startup_time", F64, "server startup_time from /server_info (changes on restart)"),
    field("server_info", STR, "the first /server_info body without the record payloads, JSON"),
    field("end_reason", STR, "why collection ended: completed | interrupted | error: ..."),
    field("observation_requests", I64, "/server_info polls and clears the collector sent and timed (every "
       "attempt of a resumed run)"),
    field("observation_server_s", F64, "seconds the server spent answering them, as the collector timed them "
       "(the observation's own cost to the server)"),
    field("collect_s", F64, "seconds the collector ran (every attempt)"),
    field("clock", STR, "clock of e2e_latency_s and the step times: wall (measured) | virtual (the emulator's "
       "cost-table clock); never mixed in one figure"),
    field("sweep_id", STR, "dspark-obs sweep: the sweep this run is one point of; null otherwise"),
    field("method", STR, "sweep: no-spec | fixed-window | compact | no-trim (else the 'method' label, if any)"),
    field("concurrency", I32, "driver concurrency (requests in flight) of the run; null in attach mode"),
])

STEPS = pa.schema([
    field("dp_rank", I16, "DP rank whose payload held the record", False),
    field("forward_ct", I64, "scheduler forward counter (prefill batches advance it too)", False),
    field("segment", I32, "server lifetime segment; increments after a detected restart", False),
    field("bs", I32, "decode batch size; -1 when absent (core component off)", False),
    field("num_running_reqs", I32, "running requests; -1 when absent", False),
    field("mode", STR, "verify mode of the step; '' when absent", False),
    field("budget", I32, "verify-token budget k* above one per request; null in static"),
    field("lag_steps", I32, "survival relay lag used for the budget; null in static"),
    field("num_verify_tokens", I32, "graph tier (compact), sum of verify_len (cap-accept), bs*(gamma+1) (static); -1 absent", False),
    field("verify_tokens_local", I32, "rank-local verify tier; -1 absent", False),
    field("verify_tokens_dp_synced", I32, "DP-synced verify tier; -1 absent", False),
    field("verify_tokens_graph_key", I32, "CUDA-graph key tokens; -1 absent", False),
    field("predicted_step_ms", F64, "cost model's predicted step time for k*"),
    field("predicted_theta", F64, "tau*(k*)/T at k*: predicted tokens per second"),
    field("step_cpu_ms", F64, "host time since the previous decode step; null after a clear, a prefill or a >1 s gap"),
    field("step_gpu_ms", F64, "device time of the whole step"),
    field("draft_gpu_ms", F64, "device time of drafting"),
    field("target_verify_gpu_ms", F64, "device time of the target verify"),
])

STEP_REQS = pa.schema([
    field("dp_rank", I16, "DP rank", False),
    field("forward_ct", I64, "step key, joins steps", False),
    field("segment", I32, "server lifetime segment", False),
    field("rid", STR, "request id; null if the server did not report it"),
    field("req_pool_index", I32, "request slot on the server", False),
    field("batch_index", I32, "the request's position in the step's reqs list: SGLang's batch order, the order "
       "the scheduler breaks ties by; null in files written before it was kept"),
    field("prefix_len", I32, "sequence length (prompt + committed output) before this step", False),
    field("verify_len", I16, "verified slots including the anchor: window = verify_len - 1", False),
    field("acc_len", I16, "committed tokens this step: correct_drafts + 1", False),
    field("correct_drafts", I16, "accepted drafts within the window", False),
    field("cap_trim", I16, "cap-accept only: accepted drafts beyond the window (else 0)", False),
    field("bonus_token", I32, "the target's token after the accepted drafts", False),
    field("draft_tokens", pa.list_(I32), "the gamma drafted token ids", False),
    field("confidence", pa.list_(F32), "conditional acceptance c_k per position (after STS); null if not sent"),
    field("survival", pa.list_(F32), "S_k = c_1...c_k per position; null if not sent"),
    field("emu_block_accept", I16, "emulator only: drafts a full-block verify would accept (truth)"),
    field("emu_expected_given_window", F32, "emulator only: E[full-block accepted drafts | what the window showed] "
       "(correct_drafts if a window draft was rejected, else w + sum_{k>w} prod_{w<i<=k} a_i)"),
])

REQUESTS = pa.schema([
    field("rid", STR, "request id", False),
    field("workload", STR, "workload name (from the rid pattern or a map)"),
    field("api", STR, "generate | completions | chat | log"),
    field("prompt_tokens", I32, "prompt length in tokens"),
    field("completion_tokens", I32, "output length in tokens"),
    field("cached_tokens", I32, "prompt tokens served from cache"),
    field("finish_reason", STR, "stop | length | abort"),
    field("temperature", F32, "sampling temperature; 0 = greedy"),
    field("max_new_tokens", I32, "requested output limit"),
    field("sampling_seed", I64, "per-request sampling seed sent by the driver"),
    field("e2e_latency_s", F64, "server-reported end-to-end latency (on the run's clock)"),
    field("ttft_s", F64, "time to first token (on the run's clock) when the server reports it (the emulator does; "
       "SGLang's non-streaming meta_info does not)"),
    field("submitted_at", TS, "when the driver sent the request"),
    field("finished_at", TS, "when the final chunk arrived"),
    field("concurrency", I32, "driver concurrency for this request"),
    field("input_ids", pa.list_(I32), "prompt token ids, when known (for companion replays)"),
    field("prompt_text", STR, "prompt text; null with --redact-text"),
    field("output_text", STR, "output text; null with --redact-text"),
    field("spec_verify_ct", I32, "decode verify steps of this request"),
    field("spec_accept_length", F64, "completion_tokens / spec_verify_ct"),
    field("spec_accept_rate", F64, "correct drafts / proposed drafts"),
    field("spec_num_correct_drafts", I64, "accepted drafts in total"),
    field("spec_num_proposed_drafts", I64, "spec_verify_ct * gamma"),
    field("spec_correct_drafts_histogram", pa.list_(I64), "steps by correct_drafts"),
    field("spec_cap_length", F64, "mean verify_len (compact/cap-accept)"),
    field("spec_cap_lens_histogram", pa.list_(I64), "steps by verify_len"),
    field("spec_block_accept_length", F64, "cap-accept only: mean full-block acc_len"),
])

TOKENS = pa.schema([
    field("rid", STR, "request id", False),
    field("pos", I32, "0-based index in the output (0 = the prefill token)", False),
    field("token_id", I32, "committed token", False),
    field("logprob", F32, "target logprob of the committed token"),
    field("top_ids", pa.list_(I32), "top-k token ids at this position"),
    field("top_logprobs", pa.list_(F32), "their target logprobs"),
])

GAPS = pa.schema([
    field("dp_rank", I16, "DP rank", False),
    field("first_missing_forward_ct", I64, "first forward_ct possibly lost", False),
    field("last_missing_forward_ct", I64, "last forward_ct possibly lost", False),
    field("reason", STR, "deque_wrap | clear | server_restart | write_backlog | write_failed | poll_error | "
       "poll_stall | request_failed | request_steps_missing", False),
    field("segment", I32, "segment after the gap", False),
    field("detected_at", TS, "when the collector noticed", False),
    field("table_name", STR, "write_backlog / write_failed: the table whose rows were dropped; null otherwise"),
    field("rows_lost", I64, "rows of table_name dropped (write_backlog / write_failed); request-steps missing"),
    field("duration_s", F64, "poll_error / poll_stall: seconds without a usable /server_info body"),
    field("rid", STR, "request_failed / request_steps_missing: the request"),
    field("detail", STR, "what was seen, e.g. the error or spec_verify_ct vs stored request-steps"),
])

DEAD_LETTERS = pa.schema([
    field("received_at", TS, "when the payload arrived", False),
    field("source", STR, "which endpoint or file", False),
    field("reason", STR, "why it was rejected", False),
    field("payload", STR, "the raw payload (truncated to 64 KiB)"),
])

# -- imported artifacts (dspark-obs ingest, and launch mode's estimator JSONL) --

ESTIMATOR_RECORDS = pa.schema([
    field("kind", STR, "step (one request-step row) | eos_end (the request ended at EOS with open blocks)", False),
    field("rid", STR, "request id", False),
    field("forward_ct", I64, "step of the row (SGLang 'fct'); null for eos_end markers"),
    field("window", I16, "drafts verified, verify_len - 1 (SGLang 'w')"),
    field("correct_drafts", I16, "accepted drafts within the window (SGLang 'cl')"),
    field("cap_trim", I16, "cap-accept: accepted drafts beyond the window (SGLang 'ct')"),
    field("trimmed_tokens", pa.list_(I32), "censored steps: the trimmed drafts d_{w+1..gamma}"),
    field("q_logprob", pa.list_(F64), "censored steps: drafter log q(d_k) of each trimmed draft (SGLang 'q_lp')"),
    field("pending_gathers", pa.list_(pa.struct([
        pa.field("block_forward_ct", I64), pa.field("offset", I16), pa.field("p_logprob", F64),
        pa.field("token", I32), pa.field("realized", I32)])),
       "SGLang 'pg': target log p of a trimmed draft of block block_forward_ct at its 1-based offset, "
       "the draft and the token realised there"),
    field("eos_end", pa.list_(I64), "eos_end markers: forward_ct of each block still open at EOS"),
    field("source_line", I64, "1-based line in the imported file", False),
])

COST_TABLES = pa.schema([
    field("path", STR, "file the table was read from", False),
    field("kind", STR, "1d (SpsCostTable) | additive (SpsAdditiveCostTable)", False),
    field("sample_batch_tokens", pa.list_(I64), "1-D: probe batch sizes in tokens"),
    field("sample_steps_per_sec", pa.list_(F64), "1-D: measured steps per second at each probe"),
    field("max_batch_tokens", I64, "1-D: largest batch the table covers"),
    field("bias_seconds", F64, "additive: constant step time"),
    field("bs_probes", pa.list_(I64), "additive: batch-size probes"),
    field("alpha_seconds", pa.list_(F64), "additive: batch-size term per probe"),
    field("m_probes", pa.list_(I64), "additive: M = bs + K probes"),
    field("theta_seconds", pa.list_(F64), "additive: token term per probe"),
    field("raw_json", STR, "the file as read", False),
    field("imported_at", TS, "when it was imported", False),
])

STS_CALIBRATIONS = pa.schema([
    field("path", STR, "file the calibration was read from", False),
    field("temperatures", pa.list_(F64), "per-position STS temperatures T_k (c = sigmoid(raw / T_k))", False),
    field("dataset", STR, "dataset the temperatures were fitted on"),
    field("num_samples", I64, "samples used for the fit"),
    field("ece_before", pa.list_(F64), "per-position ECE before STS"),
    field("ece_after", pa.list_(F64), "per-position ECE after STS"),
    field("raw_json", STR, "the file as read", False),
    field("imported_at", TS, "when it was imported", False),
])

SPS_RECORDS = pa.schema([
    field("repeat", I32, "sweep repeat index"),
    field("batch_size", I32, "requests in flight across ranks"),
    field("batch_size_per_rank", I32, "requests per DP rank"),
    field("dp_rank", I16, "DP rank of the step"),
    field("forward_ct", I64, "step's forward_ct"),
    field("num_running_reqs", I32, "running requests at the step"),
    field("num_verify_tokens", I32, "verify tokens of the step"),
    field("step_time_s", F64, "server-side step time in seconds (profiler 'step_time')"),
    field("source_line", I64, "1-based line in the imported file", False),
])

SPS_ROUNDS = pa.schema([
    field("repeat", I32, "sweep repeat index"),
    field("batch_size", I32, "requests in flight across ranks"),
    field("batch_size_per_rank", I32, "requests per DP rank"),
    field("frac", F64, "off-diagonal budget fraction; null on the diagonal (static) sweep"),
    field("batch_tokens", I64, "tokens per verify step"),
    field("steps_per_sec", F64, "1 / median steady step time"),
    field("num_steady_steps", I32, "aligned steady steps measured"),
    field("match_fraction", F64, "share of steps at the target batch"),
    field("per_rank_median_step_time_s", pa.list_(F64), "median step time per DP rank, seconds"),
    field("load_num_requests", I32, "load generator: requests sent"),
    field("load_max_new_tokens", I32, "load generator: output limit"),
    field("load_wall_seconds", F64, "load generator: wall time"),
    field("load_reached_target", pa.bool_(), "load generator: the target batch was reached"),
    field("source_line", I64, "1-based line in the imported file", False),
])
SAMPLING_OVERRIDES = pa.schema([
    field("rid", STR, "the request; null = every request of the run that recorded no temperature"),
    field("temperature", F32, "sampling temperature to assume (0 = greedy)", False),
    field("source", STR, "what gave it: ingest --temperature | ingest --workload-map (its temperature column)"),
])
"""Sampling the user stated for requests whose run recorded none (a ``/generate`` body does not echo
it); ``estimate`` uses it after a recorded temperature and before inference."""

STORE_TABLES: dict[str, pa.Schema] = {
    "runs": RUNS,
    "steps": STEPS,
    "step_reqs": STEP_REQS,
    "requests": REQUESTS,
    "tokens": TOKENS,
    "gaps": GAPS,
    "dead_letters": DEAD_LETTERS,
    "estimator_records": ESTIMATOR_RECORDS,
    "cost_tables": COST_TABLES,
    "sts_calibrations": STS_CALIBRATIONS,
    "sps_records": SPS_RECORDS,
    "sps_rounds": SPS_ROUNDS,
    "sampling_overrides": SAMPLING_OVERRIDES,
}
"""The tables the collector and ``ingest`` write."""

TABLES: dict[str, pa.Schema] = {**STORE_TABLES, **RESULT_TABLES}


def schema_for(table: str) -> pa.Schema:
    """The file schema of ``table`` with the version stamped in its metadata."""
    try:
        schema = TABLES[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(sorted(TABLES))}") from None
    return schema.with_metadata({METADATA_KEY: SCHEMA_VERSION.encode()})


def data_model_markdown() -> str:
    """Every table's columns as Markdown, for the README (a docs test keeps them equal)."""
    out = []
    for name, table in sorted(TABLES.items()):  # import order varies; the README must not
        out.append(f"### `{name}`\n\n| column | type | meaning |\n|---|---|---|")
        out.append("| `run_id` | string | partition column (`run_id=<id>` directory) |")
        for f in table:
            doc = f.metadata[b"doc"].decode() if f.metadata and b"doc" in f.metadata else ""
            doc = doc.replace("|", "\\|").replace("\n", " ")
            out.append(f"| `{f.name}` | {f.type}{'' if f.nullable else ' not null'} | {doc} |")
        out.append("")
    return "\n".join(out)
