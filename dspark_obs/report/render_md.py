"""``summary.md``: the report as plain text for a PR comment or a chat message.

Rendered from the summary dict alone (what ``summary.json`` holds), as
Markdown that reads as plain text too: short lines, pipe tables, no HTML.
"""

from __future__ import annotations

from collections import defaultdict

from dspark_obs.report.metrics import METRICS, SECTION_TITLES
from dspark_obs.report.text import (VERDICT_WORDS, counts_line, fmt_ci, fmt_delta, fmt_limit, fmt_p,
                                    fmt_value, run_line, where, word)

__all__ = ["render_markdown"]

_MAX_ROWS = 40


def _table(header: list[str], rows: list[list[str]], limit: int = _MAX_ROWS) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows[:limit]]
    if len(rows) > limit:
        out.append(f"\n({len(rows) - limit} more rows in summary.json and report.html)")
    return out + [""]


def _figure_rows(figs: list[dict]) -> list[list[str]]:
    return [[f["run_id"], f["metric"], where(f), _value_ci(f), fmt_limit(f), _drift(f), word(f["verdict"])]
            for f in figs]


def _value_ci(f: dict) -> str:
    ci = fmt_ci(f)
    return fmt_value(f["value"], f["unit"]) + (f" {ci}" if ci else "")


def _drift(f: dict) -> str:
    d = f["drift"]
    if not d or d["verdict"] == "not_tested":
        return "-"
    if d["delta"] is None or d["verdict"] in ("no_baseline", "insufficient"):
        return word(d["verdict"])
    return f"{fmt_delta(d['delta'], f['unit'])} q={fmt_p(d['q_value'])} {word(d['verdict'])}"


def _calibration(figs: list[dict], runs: list[dict]) -> list[str]:
    out = []
    for run in runs:
        mine = [f for f in figs if f["run_id"] == run["run_id"]]
        if not mine:
            continue
        first = mine[0]["detail"]
        out.append(f"{run['run_id']}: {first.get('labels')} labels, {first.get('binning')} bins. "
                   "All workloads, by draft position k:")
        out.append("")
        by = defaultdict(dict)
        for f in mine:
            if f["workload"] == "*":
                by[f["position"]][f["metric"]] = f
        rows = []
        for k in sorted(by):
            m = by[k]
            cells = [str(k), str(m["ece"]["n"]) if "ece" in m else "-"]
            for name in ("ece", "debiased_ece", "brier", "auroc", "acceptance"):
                f = m.get(name)
                cells.append("-" if f is None else _value_ci(f)
                             + (f" {word(f['verdict'])}" if f["verdict"] in ("fail", "warn") else ""))
            rows.append(cells)
        out += _table(["k", "n", "ECE [95% CI]", "debiased ECE", "Brier", "AUROC", "acceptance"], rows)
        workloads = sorted({f["workload"] for f in mine if f["workload"] not in ("*", None)})
        if workloads:
            out.append("Debiased ECE per workload and position (verdict: worst over positions and metrics):")
            out.append("")
            positions = sorted({f["position"] for f in mine if f["position"] is not None})
            rows = []
            for w in workloads:
                cells = [w]
                for k in positions:
                    f = next((f for f in mine if f["workload"] == w and f["position"] == k
                              and f["metric"] == "debiased_ece"), None)
                    cells.append("-" if f is None else fmt_value(f["value"], "fraction"))
                verdicts = {f["verdict"] for f in mine if f["workload"] == w}
                cells.append(next((VERDICT_WORDS[v] for v in ("fail", "warn", "pass") if v in verdicts), "-"))
                rows.append(cells)
            out += _table(["workload", *[f"k={k}" for k in positions], "verdict"], rows)
    return out


def _delta_ci(f: dict) -> str:
    d, unit = f["drift"], f["unit"]
    lo, hi = d["delta_ci"]["low"], d["delta_ci"]["high"]
    return fmt_delta(d["delta"], unit) + (f" [{fmt_delta(lo, unit)}, {fmt_delta(hi, unit)}]" if lo is not None else "")


def render_markdown(summary: dict) -> str:
    """The Markdown text of a report from its summary dict.

    Long: the document from top to bottom, one block per part, in the order it reads.
    """
    figs = summary["figures"]
    counts = summary["counts"]
    status = summary["status"].upper()
    lines = [f"# DSpark nightly report: {status}", ""]
    if summary["failing_line"]:
        lines += [f"Failed: {summary['failing_line']}", ""]
    else:
        lines += ["Every gate passed.", ""]
    w = summary["window"]
    window = (f"runs started in the last {w['since']} ({w['start']} to {w['end']})" if w["kind"] == "since"
              else "runs named with --run")
    base = summary["baseline"]
    th = summary["thresholds"]
    lines += [f"- Generated: {summary['generated_at']} (report {summary['report_id']})",
              f"- Data: {summary['data']}",
              f"- Window: {window}"]
    lines += [f"- Run: {run_line(r)}" for r in summary["runs"]]
    if base and base["runs"]:
        lines += [f"- Baseline: {', '.join(b['run_id'] for b in base['runs'])}"
                  + (f" (started in the {base['window']['since']} before the window)"
                     if base["window"]["kind"] == "since" else "")]
    else:
        lines += ["- Baseline: none (drift not tested)"]
    lines += [f"- Thresholds: {th['source']} (drift FDR {th['fdr']:g}, {th['n_bootstrap']} bootstrap resamples)",
              f"- Figures: {counts_line(counts)}", ""]
    header = ["run", "figure", "where", "value [95% CI]", "limit", "drift vs baseline", "verdict"]
    failed = [f for f in figs if f["verdict"] == "fail"]
    warned = [f for f in figs if f["verdict"] == "warn"]
    if failed:
        lines += ["## Failed", ""] + _table(header, _figure_rows(failed))
    if warned:
        lines += ["## Warnings", ""] + _table(header, _figure_rows(warned))
    sections = defaultdict(list)
    for f in figs:
        sections[f["section"]].append(f)
    if sections["calibration"]:
        lines += [f"## {SECTION_TITLES['calibration']}", ""] + _calibration(sections["calibration"], summary["runs"])
    for name in ("ceiling", "estimator", "costmodel", "collection", "health"):
        if not sections[name]:
            continue
        lines += [f"## {SECTION_TITLES[name]}", ""]
        if name == "estimator":
            truth = {f["detail"].get("truth_source") for f in sections[name]} - {None}
            lines += [f"Truth: {', '.join(sorted(truth))}; censored steps only.", ""]
        lines += _table(header, _figure_rows(sections[name]))
    losses = summary["collection"]
    if losses:
        lines += ["Gaps and dead letters by reason:", ""]
        lines += _table(["run", "kind", "reason", "count", "forward_cts lost"],
                        [[c["run_id"], c["kind"], c["reason"], str(c["count"]),
                          "-" if c["missing_forward_cts"] is None else str(c["missing_forward_cts"])] for c in losses])
    lines += [f"## {SECTION_TITLES['sts']}", ""]
    if not summary["sts"]:
        lines += ["Not evaluated (no run with confidences and labels; see the notes).", ""]
    for s in summary["sts"]:
        gain, iv = s["predicted_gain"], s["interval"]
        span = f" [{iv['low']:+.2%}, {iv['high']:+.2%}]" if iv["low"] is not None else ""
        temps = ", ".join(f"{t:.3g}" for t in s["temperatures"])
        if s["recommended"]:
            lines.append(f"- {s['run_id']}: REFIT RECOMMENDED. Replay predicts {gain:+.2%} tokens/s{span} with "
                         f"temperatures [{temps}]; serve {s['file']} with --speculative-dspark-confidence-sts-path.")
        else:
            lines.append(f"- {s['run_id']}: no refit needed: replay predicts {gain:+.2%} tokens/s{span} "
                         f"(temperatures [{temps}]).")
    lines.append("")
    tested = [f for f in figs if f["drift"] and f["drift"]["verdict"] in ("pass", "improved", "warn", "fail")]
    lines += ["## Drift against the baseline", ""]
    if not tested:
        lines += ["No drift tests (no baseline).", ""]
    else:
        moved = [f for f in tested if f["drift"]["verdict"] != "pass"]
        lines += [f"{len(tested)} tests, Benjamini-Hochberg FDR {th['fdr']:g}; {len(moved)} significant and material "
                  "changes.", ""]
        tests = {}
        for f in tested:
            tests.setdefault(f["drift"]["test"], []).append(f["metric"])
        lines += ["Tests: " + "; ".join(f"{', '.join(dict.fromkeys(ms))}: {t}" for t, ms in tests.items()) + ".", ""]
        if moved:
            lines += _table(["run", "figure", "where", "value", "baseline", "delta [95% CI]", "q", "verdict"],
                            [[f["run_id"], f["metric"], where(f), fmt_value(f["value"], f["unit"]),
                              fmt_value(f["drift"]["baseline_value"], f["unit"]), _delta_ci(f),
                              fmt_p(f["drift"]["q_value"]), word(f["drift"]["verdict"])] for f in moved])
    if summary["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in summary["notes"]] + [""]
    art = summary["artifacts"]
    lines += ["## Files", "", f"- {art['html']}: the full report with charts (opens offline)",
              f"- {art['json']}: every figure as data (schema {summary['schema']} v{summary['schema_version']})"]
    if art["png_dir"]:
        lines.append(f"- {art['png_dir']}/: the charts as PNG")
    lines.append("")
    lines += ["## Glossary", ""]
    lines += [f"- {m}: {METRICS[m].description}" for m in METRICS if any(f["metric"] == m for f in figs)]
    lines.append("")
    return "\n".join(lines)
