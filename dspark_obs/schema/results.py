"""The result tables: what the estimators (and ``report``) write.

Declared here, beside the store's tables, so that no command imports an
estimator to learn a table's columns (the SQL views, ``sql`` and the README's
data model read them from :data:`dspark_obs.schema.TABLES`).
"""

from __future__ import annotations

import pyarrow as pa

from dspark_obs.schema.columns import F32, F64, I16, I32, I64, STR, TS, field


def _ci(name: str, doc: str) -> list[pa.Field]:
    """A figure and its request-bootstrap 95% interval."""
    return [field(name, F64, doc), field(f"{name}_ci95_low", F64, f"{doc}: request-bootstrap 2.5%"),
            field(f"{name}_ci95_high", F64, f"{doc}: request-bootstrap 97.5%")]


CEILING = pa.schema([
    field("dp_rank", I16, "DP rank"),
    field("forward_ct", I64, "step key", False),
    field("segment", I32, "server lifetime segment"),
    field("rid", STR, "request id"),
    field("workload", STR, "the request's workload"),
    field("temperature", F32, "sampling temperature recorded (or overridden); 0 = greedy; null unknown"),
    field("sampling", STR, "greedy (exact rule) | sampled | unknown (the sampled rule)"),
    field("sampling_source", STR, "how the sampling is known: recorded | override | inferred (from the "
                                "committed tokens' top-1) | unknown"),
    field("prefix_len", I32, "sequence length before the step", False),
    field("window", I16, "drafts verified: verify_len - 1", False),
    field("correct_drafts", I16, "drafts accepted within the window", False),
    field("censored", pa.bool_(), "correct_drafts == window < gamma: the ceiling was hidden (always set)"),
    field("category", STR, "exact_in_window | censored_resolved_exact | censored_diverged | censored_eos | "
                          "censored_at_end (SGLang's analyzer)", False),
    field("walked", I16, "trimmed drafts compared with a realised token"),
    field("lo", F64, "lower end of the full-block accepted drafts (0..gamma)", False),
    field("mid", F64, "estimate of the full-block accepted drafts (expectation under sampling)", False),
    field("hi", F64, "upper end of the full-block accepted drafts", False),
    field("method", STR, "default | sglang"),
    field("survival_mid", pa.list_(F32), "per position k: estimated probability that a full verify accepts the "
                                        "first k drafts (sums to mid); the reconstructed calibration labels"),
])

CEILING_SUMMARY = pa.schema([
    field("workload", STR, "workload, or '*' for all", False),
    field("method", STR, "default | sglang", False),
    field("requests", I32, "requests with steps (the bootstrap's resampling unit)", False),
    field("steps", I64, "request-steps", False),
    field("censored_steps", I64, "steps whose ceiling was hidden", False),
    field("censored_share", F64, "censored_steps / steps"),
    field("mean_window", F64, "mean drafts verified (verify_len - 1)"),
    *_ci("mean_acc_len", "mean committed tokens per step (correct_drafts + 1)"),
    *_ci("ceiling_len_mid", "mean ceiling accept length (mid + 1): what a full block would commit"),
    *_ci("ceiling_len_lo", "mean ceiling accept length at lo (lo + 1)"),
    *_ci("ceiling_len_hi", "mean ceiling accept length at hi (hi + 1)"),
    *_ci("utilisation", "mean_acc_len / ceiling_len_mid: accepted / what a full block would accept"),
    field("utilisation_at_hi", F64, "mean_acc_len / ceiling_len_hi (utilisation if the ceiling is hi)"),
    field("utilisation_at_lo", F64, "mean_acc_len / ceiling_len_lo (utilisation if the ceiling is lo)"),
    field("n_bootstrap", I32, "bootstrap resamples behind the CIs"),
])

CEILING_VALIDATION = pa.schema([
    field("method", STR, "default | sglang", False),
    field("truth_source", STR, "companion (paired cap-accept run) | cap-accept | static (own steps) | "
                             "emulator (emu_block_accept)"),
    field("companion_run", STR, "run_id of the companion, when the truth came from one"),
    field("group_kind", STR, "all_steps | overall | sampling | category | workload | bin "
                           "(all but all_steps: censored steps only)", False),
    field("group", STR, "group value ('*' for all; bin index for bins)", False),
    field("bin", I16, "equal-count bin of mid, 0 = lowest (bins only)"),
    field("n", I64, "steps with a truth", False),
    field("coverage_n", I64, "greedy steps with a truth: the steps behind mae and coverage"),
    field("mean_lo", F64, "mean lo (drafts)"),
    field("mean_mid", F64, "mean mid (drafts)"),
    field("mean_hi", F64, "mean hi (drafts)"),
    field("mean_truth", F64, "mean realised full-block accepted drafts"),
    field("bias", F64, "mean (mid - truth): every step with a truth"),
    field("mae", F64, "mean |mid - truth| over greedy steps (a sampled step's realisation is one draw; judge "
                    "it by bias, bins of mid and emu_*)"),
    field("coverage", F64, "share of greedy steps with lo <= truth <= hi (sampled steps: see emu_coverage and "
                         "the bins' mean_lo <= mean_truth <= mean_hi)"),
    field("emu_n", I64, "steps with the emulator's expectation"),
    field("mean_emu_expected", F64, "mean emu_expected_given_window (E[full | window accepted], the per-step "
                                  "target under sampling)"),
    field("emu_bias", F64, "mean (mid - emu_expected_given_window)"),
    field("emu_mae", F64, "mean |mid - emu_expected_given_window|"),
    field("emu_coverage", F64, "share of steps with lo <= emu_expected_given_window <= hi"),
])

CALIBRATION = pa.schema([
    field("workload", STR, "workload name; '*' = all workloads", False),
    field("position", I16, "draft position k (1..gamma); the event is 'first k drafts survive a full block'", False),
    field("labels", STR, "observed | reconstructed | companion (where the truth came from)", False),
    field("binning", STR, "width15 | width20 | mass15 (equal-width or equal-mass bins)", False),
    field("mode", STR, "verify mode of the run the predictions came from"),
    field("label_source", STR, "companion run id, 'ceiling', or the run itself"),
    field("n", I64, "labelled request-steps at this position", False),
    field("n_requests", I32, "distinct requests among them (the bootstrap's unit)"),
    field("mean_predicted", F64, "mean survival S_k"),
    field("observed_rate", F64, "mean label (share of steps whose first k drafts survive)"),
    field("ece", F64, "expected calibration error (lower is better)"),
    field("ece_ci_lo", F64, "request-level bootstrap CI of ece (ece +- z x bootstrap SE, clipped to [0, 1]), "
                            "lower end; null without --bootstrap"),
    field("ece_ci_hi", F64, "request-level bootstrap CI of ece, upper end"),
    field("debiased_ece", F64, "ece minus its estimated sampling bias (Kumar et al. 2019); may be < 0"),
    field("mce", F64, "maximum calibration error over non-empty bins"),
    field("brier", F64, "Brier score (binning-independent)"),
    field("log_loss", F64, "log loss (binning-independent)"),
    field("auroc", F64, "area under the ROC curve; null when every label is the same"),
    field("bootstrap", I32, "bootstrap resamples behind the CI (0 = none)"),
    field("auroc_se", F64, "request-clustered DeLong standard error of auroc, on the steps auroc was computed on "
                           "(a sample of whole requests in a run of more than 500k steps)"),
    field("observed_rate_se", F64, "request-clustered standard error of observed_rate"),
])

CALIBRATION_BINS = pa.schema([
    field("workload", STR, "workload name; '*' = all workloads", False),
    field("position", I16, "draft position k (1..gamma)", False),
    field("labels", STR, "observed | reconstructed | companion", False),
    field("binning", STR, "width15 | width20 | mass15", False),
    field("bin", I16, "bin index (only non-empty bins are stored)", False),
    field("bin_lo", F64, "lower edge of the bin"),
    field("bin_hi", F64, "upper edge of the bin"),
    field("mean_predicted", F64, "mean survival in the bin"),
    field("observed_rate", F64, "mean label in the bin"),
    field("count", I64, "request-steps in the bin", False),
])

CALIBRATION_RESAMPLES = pa.schema([
    field("workload", STR, "workload name; '*' = all workloads", False),
    field("position", I16, "draft position k (1..gamma)", False),
    field("labels", STR, "observed | reconstructed | companion", False),
    field("binning", STR, "width15 | width20 | mass15", False),
    field("resample", I32, "request-level bootstrap resample 0..bootstrap-1 (Poisson weights drawn per rid)",
          False),
    field("ece", F64, "ece of the resample (its spread is the CI's SE; the report's drift tests difference them)"),
    field("debiased_ece", F64, "debiased_ece of the resample"),
    field("brier", F64, "brier of the resample"),
])

RECALIBRATION = pa.schema([
    field("workload", pa.string(), "workload, or '*' for all", False),
    field("position", pa.int16(), "draft position k (1..gamma): the event 'first k drafts survive'", False),
    field("method", pa.string(), "none | sts | platt | isotonic | beta", False),
    field("split", pa.string(), "held_out: scored on the requests the map was not fitted on", False),
    field("labels", pa.string(), "observed | reconstructed | companion: where the truth came from", False),
    field("n", pa.int64(), "held-out labelled steps", False),
    field("n_fit", pa.int64(), "labelled steps the map was fitted on (all workloads)"),
    field("ece", pa.float64(), "held-out ECE, 15 equal-width bins"),
    field("ece_ci_lo", pa.float64(), "95% interval of the ECE: ece - 1.96 request-bootstrap SE"),
    field("ece_ci_hi", pa.float64(), "95% interval of the ECE: ece + 1.96 request-bootstrap SE"),
    field("brier", pa.float64(), "held-out Brier score"),
    field("seed", pa.int32(), "seed of the request split and the bootstrap"),
])

COSTMODEL_FIT = pa.schema([
    field("model", STR, "fitted (the exported SGLang table) | fitted+context"),
    field("term", STR, "bias | alpha | theta | context"),
    field("probe", I64, "bs probe (alpha) or M probe (theta); null for bias and context"),
    field("value_seconds", F64, "term value in seconds (context: seconds per prefix token)"),
    field("stderr_seconds", F64, "least-squares standard error; 0 for the pinned first probes"),
    field("covered", pa.bool_(), "data lies near the probe (hat weight >= 0.5 in some cell)"),
    field("timer", STR, "step timer fitted: step_gpu_ms | step_cpu_ms | target_verify_gpu_ms"),
    field("pooled_runs", STR, "comma-separated runs whose steps were pooled into this fit"),
])

COSTMODEL_ERROR = pa.schema([
    field("model", STR, "fitted | fitted+context | server (the step's own predicted_step_ms)"),
    field("bs_bucket", STR, "batch sizes [lo, hi] of a probe interval, e.g. '8-15', or '*' for all"),
    field("n", I64, "steps with both a measured and a predicted time"),
    field("mape", F64, "mean absolute percentage error as a fraction (0.02 = 2%)"),
    field("bias_ms", F64, "mean of predicted - measured, ms (positive: model too slow)"),
    field("timer", STR, "step timer compared against"),
])

REPLAY_CONFORMANCE = pa.schema([
    field("steps", I64, "decode steps replayed (known history)"),
    field("matching_steps", I64, "steps whose replayed verify_len equal the logged ones for every request"),
    field("share", F64, "matching_steps / steps"),
    field("budget_matches", I64, "steps whose replayed budget equals the logged budget"),
    field("unknown_history_steps", I64, "steps not replayed: their lag window straddles a collection gap"),
    field("table", STR, "cost table the replay planned with (where it came from)"),
])

REPLAY_WHATIF = pa.schema([
    field("scenario", STR, "logged (measured) | replay | sts | recalibration (a survival map, "
                             "calibrate --recalibrate-out) | table | sts+table"),
    field("steps", I64, "decode steps priced"),
    field("accepted_tokens_mean", F64, "committed tokens per step (sum of acc_len), mid estimate"),
    field("accepted_tokens_lo", F64, "same, low end of the full-block acceptance interval"),
    field("accepted_tokens_hi", F64, "same, high end"),
    field("acc_len_mean", F64, "committed tokens per request-step, mid estimate"),
    field("step_ms_mean", F64, "mean step time, ms (logged: measured; others: the time model)"),
    field("tokens_per_s", F64, "sum over DP ranks of tokens / step time, mid estimate"),
    field("tokens_per_s_lo", F64, "low end"),
    field("tokens_per_s_hi", F64, "high end"),
    field("acceptance_source", STR, "logged | truth | ceiling | survival: the weakest source any step needed"),
    field("estimated_share", F64, "share of request-steps whose full-block acceptance was estimated"),
    field("time_model", STR, "how step time was priced"),
])

COMPANION_PAIRING = pa.schema([
    field("of_run", pa.string(), "the run the companion replays (runs.companion_of)", False),
    field("rid", pa.string(), "request id in that run", False),
    field("companion_rid", pa.string(), "rid of its replay in the companion run; null when not replayed"),
    field("status", pa.string(), "identical | diverged | unverified (no original tokens to compare) | failed "
                              "(the replay did not finish) | no_inputs (prompt unknown: not replayed)", False),
    field("identical", pa.bool_(), "the replay committed the same tokens; null when unknown"),
    field("output_tokens", pa.int32(), "committed tokens of the original, when known"),
    field("companion_output_tokens", pa.int32(), "committed tokens of the replay"),
    field("first_divergence", pa.int32(), "first output position whose token differs (diverged only)"),
    field("steps", pa.int64(), "the original's request-steps", False),
    field("anchor_steps", pa.int64(), "of them with a companion step at the same anchor (prefix_len)", False),
    field("paired_steps", pa.int64(), "of them paired: same anchor and same drafts (0 unless identical/unverified)",
       False),
    field("input_kind", pa.string(), "input_ids | text: how the prompt was replayed"),
    field("input_source", pa.string(), "requests (stored by the collector) | request-log | prompts"),
])

COMPANION_PAIRING_SUMMARY = pa.schema([
    field("of_run", pa.string(), "the run the companion replays", False),
    field("run_requests", pa.int32(), "requests the original run knows (requests rows and step rids)"),
    field("no_inputs", pa.int32(), "of them without a known prompt (not replayed)"),
    field("selected", pa.int32(), "requests chosen for the replay (all with inputs, or --sample/--fraction)"),
    field("replayed", pa.int32(), "selected requests whose replay finished"),
    field("failed", pa.int32(), "selected requests whose replay did not finish"),
    field("identical", pa.int32(), "replays that committed the original's tokens"),
    field("diverged", pa.int32(), "replays that committed other tokens (excluded from pairing)"),
    field("unverified", pa.int32(), "replays without original tokens to compare (paired, unverified)"),
    field("steps", pa.int64(), "the original's request-steps of the selected requests"),
    field("pairable_steps", pa.int64(), "steps of identical or unverified requests"),
    field("paired_steps", pa.int64(), "of them paired with a companion step (same anchor, same drafts)"),
    field("pairing_share", pa.float64(), "paired_steps / pairable_steps (1 = complete pairing)"),
    field("excluded_steps", pa.int64(), "steps of diverged or failed requests"),
    field("sampling_without_seed", pa.int32(), "replayed requests with temperature > 0 and no sampling_seed "
                                            "(their tokens may differ by chance)"),
    field("concurrency", pa.int32(), "requests in flight during the replay"),
    field("concurrency_source", pa.string(), "--concurrency | requests.concurrency | runs.labels | steps "
                                          "(median running requests)"),
    field("sample", pa.string(), "all, or 'N of M (seed S)'"),
    field("rid_suffix", pa.string(), "appended to each rid for its replay ('' = rids unchanged)"),
])

REPORTS = pa.schema([
    field("report_id", STR, "id of the report that judged the figure (UTC time and a short hash)", False),
    field("generated_at", TS, "when the report was made (UTC)", False),
    field("report_status", STR, "the whole report's outcome: pass | fail", False),
    field("run_started_at", TS, "when the figure's run started (the x axis of a history)"),
    field("section", STR, "calibration | ceiling | estimator | costmodel | collection | sts", False),
    field("metric", STR, "figure name, e.g. debiased_ece, utilisation, estimator_coverage", False),
    field("workload", STR, "workload; '*' = all workloads; null when not per workload"),
    field("position", I16, "draft position k (1..gamma) for per-position figures; else null"),
    field("labels", STR, "calibration labels behind the figure (companion | reconstructed | observed)"),
    field("value", F64, "the figure"),
    field("ci_low", F64, "lower end of its interval (see the report's summary.json for the method)"),
    field("ci_high", F64, "upper end of its interval"),
    field("n", I64, "samples behind the figure (request-steps, steps, ...)"),
    field("limit_kind", STR, "max | min: which side of the limit passes; null without a limit"),
    field("limit_value", F64, "the threshold the figure was held to"),
    field("threshold_verdict", STR, "pass | fail | warn | insufficient | none"),
    field("baseline_runs", STR, "comma-separated runs the drift test compared against"),
    field("baseline_value", F64, "the figure over the baseline runs"),
    field("delta", F64, "value - baseline_value"),
    field("p_value", F64, "two-sided p-value of the drift test"),
    field("q_value", F64, "Benjamini-Hochberg adjusted p-value over the report's drift tests"),
    field("drift_test", STR, "the significance test used for drift"),
    field("drift_verdict", STR, "pass | improved | warn | fail | no_baseline | not_tested | insufficient"),
    field("verdict", STR, "combined verdict of the figure: pass | warn | fail | info | insufficient", False),
    field("summary_schema_version", STR, "version of the report's summary.json schema"),
])



RESULT_TABLES: dict[str, pa.Schema] = {
    "ceiling": CEILING,
    "ceiling_summary": CEILING_SUMMARY,
    "ceiling_validation": CEILING_VALIDATION,
    "calibration": CALIBRATION,
    "calibration_bins": CALIBRATION_BINS,
    "calibration_resamples": CALIBRATION_RESAMPLES,
    "recalibration": RECALIBRATION,
    "costmodel_fit": COSTMODEL_FIT,
    "costmodel_error": COSTMODEL_ERROR,
    "replay_conformance": REPLAY_CONFORMANCE,
    "replay_whatif": REPLAY_WHATIF,
    "companion_pairing": COMPANION_PAIRING,
    "companion_pairing_summary": COMPANION_PAIRING_SUMMARY,
    "reports": REPORTS,
}
"""The tables the estimators (and ``report``) write."""

