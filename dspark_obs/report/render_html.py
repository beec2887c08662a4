"""``report.html``: one self-contained page — plotly.js inline, no CDN, no fonts or images to fetch.

The page is the summary (verdicts, tables of every figure with its interval,
threshold and drift) with the report's charts embedded as Plotly figures; it
opens from disk with no network.
"""

from __future__ import annotations

import html
from collections import defaultdict

import plotly.io as pio
from plotly.offline import get_plotlyjs

from dspark_obs.report.metrics import SECTION_TITLES
from dspark_obs.report.text import counts_line, fmt_ci, fmt_limit, fmt_p, fmt_value, run_line, where, word

__all__ = ["render_html"]

_CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;color:#262730;background:#fafafa}
main{max-width:1240px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:8px 0 4px} h2{font-size:20px;margin:36px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}
.badge{display:inline-block;padding:2px 12px;border-radius:12px;color:#fff;font-weight:600;margin-left:8px;
font-size:18px}
.pass{background:#2E7D32}.fail{background:#C62828}.warn{background:#E69F00}.info,.insufficient{background:#9E9E9E}
.improved{background:#1565C0}
td.v-fail{color:#C62828;font-weight:600} td.v-warn{color:#B07800;font-weight:600} td.v-pass{color:#2E7D32}
td.v-improved{color:#1565C0}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px;background:#fff}
th,td{border:1px solid #e2e2e2;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f0f0f0} td.l,th.l{text-align:left}
.meta td{text-align:left} .caption{color:#555;font-size:13px;margin:2px 0 18px}
.chart{background:#fff;border:1px solid #e2e2e2;margin:12px 0 4px;padding:4px}
.failing{background:#fdecea;border-left:4px solid #C62828;padding:8px 12px}
.passing{background:#edf7ed;border-left:4px solid #2E7D32;padding:8px 12px}
details>summary{cursor:pointer;margin:6px 0;color:#1F3B73}
ul.notes li{margin:2px 0}
"""


def _e(x) -> str:
    return html.escape("" if x is None else str(x))


def _drift_cells(f: dict) -> list[tuple[str, str]]:
    d = f["drift"]
    if not d or d["verdict"] == "not_tested":
        return [("-", ""), ("-", ""), ("-", ""), ("-", "")]
    if d["delta"] is None:
        return [("-", ""), ("-", ""), ("-", ""), (word(d["verdict"]), "")]
    lo, hi = d["delta_ci"]["low"], d["delta_ci"]["high"]
    delta = f"{d['delta']:+.3g}" + (f" [{lo:+.3g}, {hi:+.3g}]" if lo is not None and hi is not None else "")
    return [(fmt_value(d["baseline_value"], f["unit"]), ""), (delta, ""), (fmt_p(d["q_value"]), ""),
            (word(d["verdict"]), f"v-{d['verdict']}")]


def _figure_table(figs: list[dict]) -> str:
    head = ("<tr><th class=l>run</th><th class=l>figure</th><th class=l>where</th><th>n</th><th>value</th>"
            "<th>95% CI</th><th>limit</th><th>threshold</th><th>baseline</th><th>Δ vs baseline [95% CI]</th>"
            "<th>q</th><th>drift</th><th>verdict</th></tr>")
    rows = []
    for f in figs:
        t = f["threshold"]
        tv = t["verdict"] if t else "none"
        cells = [f"<td class=l>{_e(f['run_id'])}</td>", f"<td class=l title='{_e(f['metric'])}'>{_e(f['title'])}</td>",
                 f"<td class=l>{_e(where(f))}</td>", f"<td>{_e(f['n'] if f['n'] is not None else '-')}</td>",
                 f"<td>{_e(fmt_value(f['value'], f['unit']))}</td>", f"<td>{_e(fmt_ci(f))}</td>",
                 f"<td>{_e(fmt_limit(f, symbols=True))}</td>", f"<td class='v-{tv}'>{_e(word(tv))}</td>"]
        cells += [f"<td class='{cls}'>{_e(text)}</td>" for text, cls in _drift_cells(f)]
        cells.append(f"<td class='v-{f['verdict']}'>{_e(word(f['verdict']))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _section_tables(figs: list[dict]) -> str:
    """Headline rows open (all workloads, per-run figures, anything not passing), the rest folded."""
    head = [f for f in figs if f["workload"] in ("*", None) or f["verdict"] in ("fail", "warn")]
    rest = [f for f in figs if f not in head]
    out = _figure_table(head) if head else ""
    if rest:
        out += (f"<details><summary>{len(rest)} more figures (per workload)</summary>"
                f"{_figure_table(rest)}</details>")
    return out


def _chart(chart, png: str | None) -> str:
    div = pio.to_html(chart.figure, full_html=False, include_plotlyjs=False, div_id=f"chart-{chart.name}",
                      config={"displaylogo": False, "responsive": True})
    link = f" <a href='{_e(png)}'>PNG</a>" if png else ""
    return (f"<div class=chart data-chart='{_e(chart.name)}'>{div}</div>"
            f"<p class=caption>{_e(chart.caption)}{link}</p>")


def render_html(summary: dict, charts: list, pngs: dict[str, str] | None = None) -> str:
    """The report page: ``summary`` (the summary dict) and ``charts`` (:class:`~dspark_obs.report.plots.Chart`).

    Long: the page from top to bottom, one block per part, in the order it reads.
    """
    pngs = pngs or {}
    figs = summary["figures"]
    status = summary["status"]
    by_section: dict[str, list[dict]] = defaultdict(list)
    for f in figs:
        by_section[f["section"]].append(f)
    charts_by: dict[str, list] = defaultdict(list)
    for c in charts:
        charts_by[c.section].append(c)
    parts = [f"<h1>DSpark nightly report <span class='badge {status}'>{status.upper()}</span></h1>"]
    if summary["failing_line"]:
        items = "".join(f"<li>{_e(item)}</li>" for item in summary["failing_line"].split("; "))
        parts.append(f"<div class=failing><b>Failed:</b><ul>{items}</ul></div>")
    else:
        parts.append("<p class=passing>Every gate passed.</p>")
    c = summary["counts"]
    w = summary["window"]
    base = summary["baseline"]
    meta = [("generated", f"{summary['generated_at']} · report {summary['report_id']}"), ("data", summary["data"]),
            ("window", f"started in the last {w['since']} ({w['start']} – {w['end']})" if w["kind"] == "since"
             else "runs named with --run"),
            ("runs", "; ".join(run_line(r) for r in summary["runs"])),
            ("baseline", ", ".join(b["run_id"] for b in base["runs"]) if base and base["runs"] else "none"),
            ("thresholds", f"{summary['thresholds']['source']} · drift FDR {summary['thresholds']['fdr']:g}"),
            ("figures", counts_line(c))]
    parts.append("<table class=meta>" + "".join(f"<tr><th class=l>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in meta)
                 + "</table>")
    for section in ("calibration", "ceiling", "estimator", "costmodel", "collection", "health", "sts"):
        if not by_section[section] and not charts_by[section]:
            continue
        parts.append(f"<h2 id='{section}'>{_e(SECTION_TITLES[section])}</h2>")
        if section == "sts":
            for s in summary["sts"]:
                gain = s["predicted_gain"]
                text = (f"<b>Refit recommended</b>: replay predicts {gain:+.2%} tokens/s; serve "
                        f"<code>{_e(s['file'])}</code> with --speculative-dspark-confidence-sts-path."
                        if s["recommended"] else f"No refit needed: replay predicts {gain:+.2%} tokens/s.")
                parts.append(f"<p>{_e(s['run_id'])}: {text} Temperatures: "
                             f"{_e(', '.join(f'{t:.3g}' for t in s['temperatures']))}.</p>")
        last_run = None
        for chart in charts_by[section]:
            if chart.run_id and chart.run_id != last_run:
                parts.append(f"<h3>{_e(chart.run_id)}</h3>")
            last_run = chart.run_id
            parts.append(_chart(chart, pngs.get(chart.name)))
        if by_section[section]:
            parts.append(_section_tables(by_section[section]))
        if section == "collection" and summary["collection"]:
            rows = "".join(f"<tr><td class=l>{_e(x['run_id'])}</td><td class=l>{_e(x['kind'])}</td>"
                           f"<td class=l>{_e(x['reason'])}</td><td>{x['count']}</td>"
                           f"<td>{_e('-' if x['missing_forward_cts'] is None else x['missing_forward_cts'])}</td></tr>"
                           for x in summary["collection"])
            parts.append("<table><tr><th class=l>run</th><th class=l>kind</th><th class=l>reason</th><th>count</th>"
                         f"<th>forward_cts lost</th></tr>{rows}</table>")
    for section, title in (("throughput", "Throughput sweep: Fig. 1 and Fig. 3"),
                           ("drift", "Drift against the baseline"), ("history", "History")):
        if charts_by[section]:
            parts.append(f"<h2 id='{section}'>{title}</h2>")
            parts += [_chart(ch, pngs.get(ch.name)) for ch in charts_by[section]]
    if summary["notes"]:
        parts.append("<h2 id=notes>Notes</h2><ul class=notes>"
                     + "".join(f"<li>{_e(n)}</li>" for n in summary["notes"]) + "</ul>")
    title = f"DSpark nightly report: {status.upper()} ({', '.join(r['run_id'] for r in summary['runs'])})"
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            "<meta name=viewport content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style>"
            f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><main>{''.join(parts)}</main></body></html>\n")
