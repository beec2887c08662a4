"""The figures a report judges: name, section, unit, which way is better, and the drift test.

One entry per metric; the thresholds file, the summary JSON, the Markdown and
the HTML all take their names and descriptions from here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MetricInfo", "METRICS", "SECTIONS", "SECTION_TITLES", "info"]

SECTIONS = ("calibration", "ceiling", "estimator", "costmodel", "collection", "sts", "health")
SECTION_TITLES = {
    "calibration": "Calibration of the confidence head",
    "ceiling": "Acceptance against the full-block ceiling",
    "estimator": "Block-accept estimator against a truth",
    "costmodel": "Step-time cost model",
    "collection": "Collection: gaps and dead letters",
    "sts": "STS refit recommendation",
    "health": "Trimming health: is DSpark doing its job?",
}


@dataclass(frozen=True)
class MetricInfo:
    name: str
    section: str
    title: str
    unit: str  # fraction | tokens | drafts | count
    better: str  # lower | higher | none
    drift_test: str  # the test :mod:`dspark_obs.report.drift` applies ('' = none)
    description: str


_BOOT = "request-bootstrap difference"
_CI_Z = "z-test on the difference (SEs from the 95% CIs)"

METRICS: dict[str, MetricInfo] = {m.name: m for m in (
    MetricInfo("ece", "calibration", "ECE", "fraction", "lower", _BOOT,
               "expected calibration error of survival S_k against 'the first k drafts survive a full block'"),
    MetricInfo("debiased_ece", "calibration", "debiased ECE", "fraction", "lower", _BOOT,
               "ECE minus its finite-sample bias (Kumar et al. 2019); comparable across sample sizes"),
    MetricInfo("brier", "calibration", "Brier", "fraction", "lower", _BOOT,
               "mean squared error of S_k (mixes calibration and the base rate)"),
    MetricInfo("auroc", "calibration", "AUROC", "fraction", "higher",
               "z-test on the difference (request-clustered DeLong SEs)",
               "how well S_k ranks surviving blocks above failing ones"),
    MetricInfo("acceptance", "calibration", "acceptance", "fraction", "higher",
               "two-proportion z-test (request-clustered SEs)",
               "share of request-steps whose first k drafts survive a full-block verify"),
    MetricInfo("utilisation", "ceiling", "utilisation", "fraction", "higher", _CI_Z,
               "tokens committed / tokens a full-block verify would commit"),
    MetricInfo("mean_acc_len", "ceiling", "accept length", "tokens", "higher", _CI_Z,
               "tokens committed per request-step (correct_drafts + 1)"),
    MetricInfo("ceiling_len", "ceiling", "ceiling length", "tokens", "higher", _CI_Z,
               "tokens a full-block verify would commit per request-step (mid estimate)"),
    MetricInfo("mean_window", "ceiling", "mean window", "drafts", "none", "",
               "drafts verified per request-step (verify_len - 1)"),
    MetricInfo("censored_share", "ceiling", "censored share", "fraction", "none", "",
               "request-steps whose whole window was accepted below gamma (ceiling hidden)"),
    MetricInfo("estimator_coverage", "estimator", "interval coverage", "fraction", "higher",
               "two-proportion z-test",
               "censored steps whose true full-block acceptance lies in the estimate's [lo, hi]"),
    MetricInfo("estimator_bias", "estimator", "estimate bias", "drafts", "none", "",
               "mean (estimate - truth) over censored steps, in drafts"),
    MetricInfo("costmodel_mape", "costmodel", "fitted table MAPE", "fraction", "lower", "Welch t-test",
               "mean absolute percentage error of the fitted additive table against measured step time"),
    MetricInfo("server_table_mape", "costmodel", "server table MAPE", "fraction", "lower", "Welch t-test",
               "the same error for the server's own predicted_step_ms (the table it planned with)"),
    MetricInfo("lost_record_share", "collection", "lost records", "fraction", "lower", "two-proportion z-test",
               "forward_cts lost to gaps / (decode steps + lost); an upper bound (prefills count too)"),
    MetricInfo("dead_letters", "collection", "dead letters", "count", "lower",
               "conditional binomial test of two Poisson rates",
               "payloads rejected because they did not fit SGLang's contract"),
    MetricInfo("budget_trimmed_share", "health", "trimming active", "fraction", "higher", "",
               "request-steps the planner's budget trimmed (first trimmed draft had survival >= 0.01); 0 means "
               "trimming is inactive, as without a cost table (compact runs only)"),
    MetricInfo("trim_ratio", "health", "trim ratio", "fraction", "none", "",
               "verified slots / what a no-trim verify would verify (sum verify_len / request-steps x (gamma+1))"),
    MetricInfo("trim_regret", "health", "trim regret", "fraction", "lower", "",
               "trimmed request-steps that accepted their whole window (exact lower bound on loss)"),
    MetricInfo("tokens_lost", "health", "tokens lost to trimming", "tokens", "lower", "",
               "ceiling - accepted, summed over the run's request-steps, with the ceiling's [lo, hi] (needs estimate)"),
    MetricInfo("accept_rate_gap", "health", "acceptance denominator gap", "fraction", "none", "",
               "accepted / drafts verified minus SGLang's spec_accept_rate (accepted / full block)"),
    MetricInfo("expected_accept_error", "health", "expected vs actual acceptance", "fraction", "lower", "",
               "|survival-predicted - observed| / observed accepted drafts per request-step"),
    MetricInfo("padding_share", "health", "graph-tier padding", "fraction", "lower", "",
               "(num_verify_tokens - sum verify_len) / num_verify_tokens over compact steps"),
    MetricInfo("costtable_mape_drift", "health", "cost-table drift", "fraction", "lower", "",
               "MAPE of predicted_step_ms vs step_gpu_ms, second half of the run's steps minus the first"),
    MetricInfo("observation_share", "health", "observation overhead", "fraction", "lower", "",
               "share of the collector's wall time the server spent answering its /server_info polls and clears"),
    MetricInfo("sts_predicted_gain", "sts", "STS refit gain", "fraction", "lower", "",
               "tokens/s an STS refit would add, from schedule replay (interval from the ceiling's [lo, hi])"),
)}


def info(metric: str) -> MetricInfo:
    """The :class:`MetricInfo` of ``metric``; KeyError naming the known metrics."""
    try:
        return METRICS[metric]
    except KeyError:
        raise KeyError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}") from None
