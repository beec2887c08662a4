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

SCHEMA_VERSION = "1"
METADATA_KEY = b"dspark_obs.schema_version"

_i16, _i32, _i64 = pa.int16(), pa.int32(), pa.int64()
_f32, _f64, _str = pa.float32(), pa.float64(), pa.string()
_ts = pa.timestamp("us", tz="UTC")


def field(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    """A column with its documentation attached (the README's data model is built from it)."""
    return pa.field(name, type_, nullable=nullable, metadata={b"doc": doc.encode()})


_f = field


RUNS = pa.schema([
    _f("started_at", _ts, "when collection started (UTC)", False),
    _f("ended_at", _ts, "when collection ended; null while running"),
    _f("source", _str, "emulator | sglang | import", False),
    _f("server_url", _str, "base URL of the server; null for imports"),
    _f("mode", _str, "static | compact | cap-accept (SGLANG_RAGGED_VERIFY_MODE)"),
    _f("gamma", _i32, "draft block size (drafts per step)"),
    _f("dp_size", _i32, "number of DP ranks (payloads per /server_info)"),
    _f("labels", pa.map_(_str, _str), "free-form key/value labels (workloads, seed, ...)"),
    _f("companion_of", _str, "run_id of the compact run this cap-accept run replays"),
    _f("seed", _i64, "emulator or driver seed, when known"),
    _f("server_version", _str, "server's reported version"),
    _f("startup_time", _f64, "server startup_time from /server_info (changes on restart)"),
    _f("server_info", _str, "the first /server_info body without the record payloads, JSON"),
    _f("end_reason", _str, "why collection ended: completed | interrupted | error: ..."),
    _f("observation_requests", _i64, "/server_info polls and clears the collector sent and timed (every "
       "attempt of a resumed run)"),
    _f("observation_server_s", _f64, "seconds the server spent answering them, as the collector timed them "
       "(the observation's own cost to the server)"),
    _f("collect_s", _f64, "seconds the collector ran (every attempt)"),
    _f("clock", _str, "clock of e2e_latency_s and the step times: wall (measured) | virtual (the emulator's "
       "cost-table clock); never mixed in one figure"),
    _f("sweep_id", _str, "dspark-obs sweep: the sweep this run is one point of; null otherwise"),
    _f("method", _str, "sweep: no-spec | fixed-window | compact | no-trim (else the 'method' label, if any)"),
    _f("concurrency", _i32, "driver concurrency (requests in flight) of the run; null in attach mode"),
])

STEPS = pa.schema([
    _f("dp_rank", _i16, "DP rank whose payload held the record", False),
    _f("forward_ct", _i64, "scheduler forward counter (prefill batches advance it too)", False),
    _f("segment", _i32, "server lifetime segment; increments after a detected restart", False),
    _f("bs", _i32, "decode batch size; -1 when absent (core component off)", False),
    _f("num_running_reqs", _i32, "running requests; -1 when absent", False),
    _f("mode", _str, "verify mode of the step; '' when absent", False),
    _f("budget", _i32, "verify-token budget k* above one per request; null in static"),
    _f("lag_steps", _i32, "survival relay lag used for the budget; null in static"),
    _f("num_verify_tokens", _i32, "graph tier (compact), sum of verify_len (cap-accept), bs*(gamma+1) (static); -1 absent", False),
    _f("verify_tokens_local", _i32, "rank-local verify tier; -1 absent", False),
    _f("verify_tokens_dp_synced", _i32, "DP-synced verify tier; -1 absent", False),
    _f("verify_tokens_graph_key", _i32, "CUDA-graph key tokens; -1 absent", False),
    _f("predicted_step_ms", _f64, "cost model's predicted step time for k*"),
    _f("predicted_theta", _f64, "tau*(k*)/T at k*: predicted tokens per second"),
    _f("step_cpu_ms", _f64, "host time since the previous decode step; null after a clear, a prefill or a >1 s gap"),
    _f("step_gpu_ms", _f64, "device time of the whole step"),
    _f("draft_gpu_ms", _f64, "device time of drafting"),
    _f("target_verify_gpu_ms", _f64, "device time of the target verify"),
])

STEP_REQS = pa.schema([
    _f("dp_rank", _i16, "DP rank", False),
    _f("forward_ct", _i64, "step key, joins steps", False),
    _f("segment", _i32, "server lifetime segment", False),
    _f("rid", _str, "request id; null if the server did not report it"),
    _f("req_pool_index", _i32, "request slot on the server", False),
    _f("prefix_len", _i32, "sequence length (prompt + committed output) before this step", False),
    _f("verify_len", _i16, "verified slots including the anchor: window = verify_len - 1", False),
    _f("acc_len", _i16, "committed tokens this step: correct_drafts + 1", False),
    _f("correct_drafts", _i16, "accepted drafts within the window", False),
    _f("cap_trim", _i16, "cap-accept only: accepted drafts beyond the window (else 0)", False),
    _f("bonus_token", _i32, "the target's token after the accepted drafts", False),
    _f("draft_tokens", pa.list_(_i32), "the gamma drafted token ids", False),
    _f("confidence", pa.list_(_f32), "conditional acceptance c_k per position (after STS); null if not sent"),
    _f("survival", pa.list_(_f32), "S_k = c_1...c_k per position; null if not sent"),
    _f("emu_block_accept", _i16, "emulator only: drafts a full-block verify would accept (truth)"),
    _f("emu_expected_given_window", _f32, "emulator only: E[full-block accepted drafts | what the window showed] "
       "(correct_drafts if a window draft was rejected, else w + sum_{k>w} prod_{w<i<=k} a_i)"),
])

REQUESTS = pa.schema([
    _f("rid", _str, "request id", False),
    _f("workload", _str, "workload name (from the rid pattern or a map)"),
    _f("api", _str, "generate | completions | chat | log"),
    _f("prompt_tokens", _i32, "prompt length in tokens"),
    _f("completion_tokens", _i32, "output length in tokens"),
    _f("cached_tokens", _i32, "prompt tokens served from cache"),
    _f("finish_reason", _str, "stop | length | abort"),
    _f("temperature", _f32, "sampling temperature; 0 = greedy"),
    _f("max_new_tokens", _i32, "requested output limit"),
    _f("sampling_seed", _i64, "per-request sampling seed sent by the driver"),
    _f("e2e_latency_s", _f64, "server-reported end-to-end latency (on the run's clock)"),
    _f("ttft_s", _f64, "time to first token (on the run's clock) when the server reports it (the emulator does; "
       "SGLang's non-streaming meta_info does not)"),
    _f("submitted_at", _ts, "when the driver sent the request"),
    _f("finished_at", _ts, "when the final chunk arrived"),
    _f("concurrency", _i32, "driver concurrency for this request"),
    _f("input_ids", pa.list_(_i32), "prompt token ids, when known (for companion replays)"),
    _f("prompt_text", _str, "prompt text; null with --redact-text"),
    _f("output_text", _str, "output text; null with --redact-text"),
    _f("spec_verify_ct", _i32, "decode verify steps of this request"),
    _f("spec_accept_length", _f64, "completion_tokens / spec_verify_ct"),
    _f("spec_accept_rate", _f64, "correct drafts / proposed drafts"),
    _f("spec_num_correct_drafts", _i64, "accepted drafts in total"),
    _f("spec_num_proposed_drafts", _i64, "spec_verify_ct * gamma"),
    _f("spec_correct_drafts_histogram", pa.list_(_i64), "steps by correct_drafts"),
    _f("spec_cap_length", _f64, "mean verify_len (compact/cap-accept)"),
    _f("spec_cap_lens_histogram", pa.list_(_i64), "steps by verify_len"),
    _f("spec_block_accept_length", _f64, "cap-accept only: mean full-block acc_len"),
])

TOKENS = pa.schema([
    _f("rid", _str, "request id", False),
    _f("pos", _i32, "0-based index in the output (0 = the prefill token)", False),
    _f("token_id", _i32, "committed token", False),
    _f("logprob", _f32, "target logprob of the committed token"),
    _f("top_ids", pa.list_(_i32), "top-k token ids at this position"),
    _f("top_logprobs", pa.list_(_f32), "their target logprobs"),
])

GAPS = pa.schema([
    _f("dp_rank", _i16, "DP rank", False),
    _f("first_missing_forward_ct", _i64, "first forward_ct possibly lost", False),
    _f("last_missing_forward_ct", _i64, "last forward_ct possibly lost", False),
    _f("reason", _str, "deque_wrap | clear | server_restart | write_backlog | write_failed | poll_error | "
       "poll_stall | request_failed | request_steps_missing", False),
    _f("segment", _i32, "segment after the gap", False),
    _f("detected_at", _ts, "when the collector noticed", False),
    _f("table_name", _str, "write_backlog / write_failed: the table whose rows were dropped; null otherwise"),
    _f("rows_lost", _i64, "rows of table_name dropped (write_backlog / write_failed); request-steps missing"),
    _f("duration_s", _f64, "poll_error / poll_stall: seconds without a usable /server_info body"),
    _f("rid", _str, "request_failed / request_steps_missing: the request"),
    _f("detail", _str, "what was seen, e.g. the error or spec_verify_ct vs stored request-steps"),
])

DEAD_LETTERS = pa.schema([
    _f("received_at", _ts, "when the payload arrived", False),
    _f("source", _str, "which endpoint or file", False),
    _f("reason", _str, "why it was rejected", False),
    _f("payload", _str, "the raw payload (truncated to 64 KiB)"),
])

# -- imported artifacts (dspark-obs ingest, and launch mode's estimator JSONL) --

ESTIMATOR_RECORDS = pa.schema([
    _f("kind", _str, "step (one request-step row) | eos_end (the request ended at EOS with open blocks)", False),
    _f("rid", _str, "request id", False),
    _f("forward_ct", _i64, "step of the row (SGLang 'fct'); null for eos_end markers"),
    _f("window", _i16, "drafts verified, verify_len - 1 (SGLang 'w')"),
    _f("correct_drafts", _i16, "accepted drafts within the window (SGLang 'cl')"),
    _f("cap_trim", _i16, "cap-accept: accepted drafts beyond the window (SGLang 'ct')"),
    _f("trimmed_tokens", pa.list_(_i32), "censored steps: the trimmed drafts d_{w+1..gamma}"),
    _f("q_logprob", pa.list_(_f64), "censored steps: drafter log q(d_k) of each trimmed draft (SGLang 'q_lp')"),
    _f("pending_gathers", pa.list_(pa.struct([
        pa.field("block_forward_ct", _i64), pa.field("offset", _i16), pa.field("p_logprob", _f64),
        pa.field("token", _i32), pa.field("realized", _i32)])),
       "SGLang 'pg': target log p of a trimmed draft of block block_forward_ct at its 1-based offset, "
       "the draft and the token realised there"),
    _f("eos_end", pa.list_(_i64), "eos_end markers: forward_ct of each block still open at EOS"),
    _f("source_line", _i64, "1-based line in the imported file", False),
])

COST_TABLES = pa.schema([
    _f("path", _str, "file the table was read from", False),
    _f("kind", _str, "1d (SpsCostTable) | additive (SpsAdditiveCostTable)", False),
    _f("sample_batch_tokens", pa.list_(_i64), "1-D: probe batch sizes in tokens"),
    _f("sample_steps_per_sec", pa.list_(_f64), "1-D: measured steps per second at each probe"),
    _f("max_batch_tokens", _i64, "1-D: largest batch the table covers"),
    _f("bias_seconds", _f64, "additive: constant step time"),
    _f("bs_probes", pa.list_(_i64), "additive: batch-size probes"),
    _f("alpha_seconds", pa.list_(_f64), "additive: batch-size term per probe"),
    _f("m_probes", pa.list_(_i64), "additive: M = bs + K probes"),
    _f("theta_seconds", pa.list_(_f64), "additive: token term per probe"),
    _f("raw_json", _str, "the file as read", False),
    _f("imported_at", _ts, "when it was imported", False),
])

STS_CALIBRATIONS = pa.schema([
    _f("path", _str, "file the calibration was read from", False),
    _f("temperatures", pa.list_(_f64), "per-position STS temperatures T_k (c = sigmoid(raw / T_k))", False),
    _f("dataset", _str, "dataset the temperatures were fitted on"),
    _f("num_samples", _i64, "samples used for the fit"),
    _f("ece_before", pa.list_(_f64), "per-position ECE before STS"),
    _f("ece_after", pa.list_(_f64), "per-position ECE after STS"),
    _f("raw_json", _str, "the file as read", False),
    _f("imported_at", _ts, "when it was imported", False),
])

SPS_RECORDS = pa.schema([
    _f("repeat", _i32, "sweep repeat index"),
    _f("batch_size", _i32, "requests in flight across ranks"),
    _f("batch_size_per_rank", _i32, "requests per DP rank"),
    _f("dp_rank", _i16, "DP rank of the step"),
    _f("forward_ct", _i64, "step's forward_ct"),
    _f("num_running_reqs", _i32, "running requests at the step"),
    _f("num_verify_tokens", _i32, "verify tokens of the step"),
    _f("step_time_s", _f64, "server-side step time in seconds (profiler 'step_time')"),
    _f("source_line", _i64, "1-based line in the imported file", False),
])

SPS_ROUNDS = pa.schema([
    _f("repeat", _i32, "sweep repeat index"),
    _f("batch_size", _i32, "requests in flight across ranks"),
    _f("batch_size_per_rank", _i32, "requests per DP rank"),
    _f("frac", _f64, "off-diagonal budget fraction; null on the diagonal (static) sweep"),
    _f("batch_tokens", _i64, "tokens per verify step"),
    _f("steps_per_sec", _f64, "1 / median steady step time"),
    _f("num_steady_steps", _i32, "aligned steady steps measured"),
    _f("match_fraction", _f64, "share of steps at the target batch"),
    _f("per_rank_median_step_time_s", pa.list_(_f64), "median step time per DP rank, seconds"),
    _f("load_num_requests", _i32, "load generator: requests sent"),
    _f("load_max_new_tokens", _i32, "load generator: output limit"),
    _f("load_wall_seconds", _f64, "load generator: wall time"),
    _f("load_reached_target", pa.bool_(), "load generator: the target batch was reached"),
    _f("source_line", _i64, "1-based line in the imported file", False),
])
SAMPLING_OVERRIDES = pa.schema([
    _f("rid", _str, "the request; null = every request of the run that recorded no temperature"),
    _f("temperature", _f32, "sampling temperature to assume (0 = greedy)", False),
    _f("source", _str, "what gave it: ingest --temperature | ingest --workload-map (its temperature column)"),
])
"""Sampling the user stated for requests whose run recorded none (a ``/generate`` body does not echo
it); ``estimate`` uses it after a recorded temperature and before inference."""

TABLES: dict[str, pa.Schema] = {
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


def schema_for(table: str) -> pa.Schema:
    """The file schema of ``table`` with the version stamped in its metadata."""
    try:
        schema = TABLES[table]
    except KeyError:
        raise KeyError(f"unknown table {table!r}; known: {', '.join(sorted(TABLES))}") from None
    return schema.with_metadata({METADATA_KEY: SCHEMA_VERSION.encode()})


def register(name: str, schema: pa.Schema) -> None:
    """Add a table (estimators write their results through this)."""
    TABLES[name] = schema


def load_result_schemas() -> None:
    """Import every estimator module so the result tables they register exist.

    Estimators own their result schemas (``register`` at import); the SQL layer
    calls this before creating views so every table has a view.
    """
    import importlib
    import pkgutil

    import dspark_obs.estimators as estimators

    for info in pkgutil.iter_modules(estimators.__path__):
        importlib.import_module(f"dspark_obs.estimators.{info.name}")


def data_model_markdown() -> str:
    """Every table's columns as Markdown, for the README (a docs test keeps them equal)."""
    load_result_schemas()
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
