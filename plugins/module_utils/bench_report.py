# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark results as files people read: CSV per host, line charts, one self-contained HTML report.

The charts are matplotlib figures (no pyplot, so no display is needed), saved as PNG files and inlined into the HTML as
SVG, so the report is one file that opens anywhere (no network, no scripts). matplotlib is needed on the machine that
builds the report only (the control node).
"""

from __future__ import annotations

import csv
import html
import io
import json
import re
import traceback

try:
    import matplotlib
    from matplotlib import ticker
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state
except ImportError:
    HAS_MATPLOTLIB = False
    MATPLOTLIB_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_MATPLOTLIB = True
    MATPLOTLIB_IMPORT_ERROR = None

CSV_FIELDS = (
    "host", "concurrency", "requests", "successful", "failed", "duration_s", "output_tokens", "prompt_tokens_mean",
    "output_throughput", "request_throughput", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "decode_tps_mean",
    "decode_tps_p50", "tpot_mean_ms", "itl_mean_ms", "latency_mean_ms", "latency_p99_ms", "errors",
)

# One color per host line (color-blind friendly: Okabe-Ito), as RGB so a screenshot check can look for it.
PALETTE = ((0, 114, 178), (230, 159, 0), (0, 158, 115), (204, 121, 167), (86, 180, 233), (213, 94, 0),
           (240, 228, 66), (0, 0, 0))

# (file stem, title, y-axis label, level key): the report's charts, x = concurrency, one line per host.
CHARTS = (
    ("throughput", "Output throughput vs concurrency", "output throughput (tokens/s, all requests)",
     "output_throughput"),
    ("ttft_p99", "TTFT p99 vs concurrency", "p99 time to first token (ms)", "ttft_p99_ms"),
)
X_LABEL = "concurrent requests"

# Deterministic SVG (same data, same bytes) and text kept as <text>, so the page stays searchable and small.
_SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "onprem-vllm-report"}


class ChartError(Exception):
    """The charts cannot be drawn (matplotlib is missing on the machine running the report)."""


def _require_matplotlib():
    if not HAS_MATPLOTLIB:
        raise ChartError("the benchmark report's charts need matplotlib in the Python that builds the report, on the "
                         "control node (pip install matplotlib): %s" % MATPLOTLIB_IMPORT_ERROR.splitlines()[-1])


def hex_color(rgb):
    return "#%02x%02x%02x" % tuple(rgb)


def _safe_id(text):
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(text))


def _tick_label(value, pos=None):
    """1,500 / 12.5 / 0.25: thousands separated, no exponent, no trailing zeros."""
    return "{:,.3f}".format(value).rstrip("0").rstrip(".")


def line_chart(stem, title, y_label, series):
    """A Figure: one line with markers per (name, [(x, y or None), ...]), x on a log2 axis ticked at the measured
    levels (a sweep doubles its concurrency). A series without a value is listed in the legend as "(no data)"."""
    _require_matplotlib()
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    axes = figure.add_subplot()
    xs = sorted({x for name, points in series for x, y in points if y is not None})
    for idx, (name, points) in enumerate(series):
        measured = sorted((x, y) for x, y in points if y is not None)
        axes.plot([x for x, y in measured], [y for x, y in measured], marker="o", markersize=6, linewidth=2.5,
                  color=hex_color(PALETTE[idx % len(PALETTE)]), gid="%s-host-%s" % (stem, _safe_id(name)),
                  label=str(name) + ("" if measured else " (no data)"))
    axes.set_title(title, fontsize=14, fontweight="bold")
    axes.set_xlabel(X_LABEL, fontsize=12)
    axes.set_ylabel(y_label, fontsize=12)
    if xs:
        axes.set_xscale("log", base=2)
        if len(xs) == 1:
            axes.set_xlim(xs[0] / 2.0, xs[0] * 2.0)
        if len(xs) <= 12:
            axes.set_xticks(xs)
        axes.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, pos: "%g" % value))
        axes.xaxis.set_minor_locator(ticker.NullLocator())
    else:
        axes.text(0.5, 0.5, "no level was measured", transform=axes.transAxes, ha="center", va="center",
                  fontsize=12, color="#555555")
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_formatter(ticker.FuncFormatter(_tick_label))
    axes.tick_params(labelsize=11)
    axes.grid(True, color="#dddddd", linewidth=0.8)
    axes.set_axisbelow(True)
    axes.legend(title="host", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=11,
                title_fontsize=11)
    return figure


def charts(hosts):
    """{'throughput': Figure, 'ttft_p99': Figure} from [{'name', 'levels'}]."""
    return {stem: line_chart(stem, title, y_label,
                             [(h["name"], [(lv["concurrency"], lv.get(key)) for lv in h.get("levels") or []])
                              for h in hosts])
            for stem, title, y_label, key in CHARTS}


def png(figure, dpi=120):
    """PNG bytes of a chart (the files beside the report)."""
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=dpi, metadata={"Software": None})
    return out.getvalue()


def svg(figure):
    """A chart as an <svg> element to inline into HTML: no XML prolog, no metadata, scaled by its viewBox."""
    out = io.StringIO()
    with matplotlib.rc_context(_SVG_RC):
        figure.savefig(out, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = out.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    # Let the page's CSS size it: drop the fixed width/height in pt, keep the viewBox.
    return re.sub(r'^<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", text, count=1)

# ------------------------------------------------------------------------------------------------------------------
# Files


def levels_csv(host, levels):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for level in levels:
        row = {key: level.get(key) for key in CSV_FIELDS if key not in ("host", "errors")}
        row["host"] = host
        row["errors"] = "; ".join("%s x%d" % (e["error"], e["count"]) for e in level.get("errors") or [])
        writer.writerow(row)
    return out.getvalue()


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:4px} .meta{color:#555;margin-top:0}
.plots{display:flex;flex-wrap:wrap;gap:16px} .plots svg{width:660px;max-width:100%;height:auto;border:1px solid #ddd}
table{border-collapse:collapse;margin:8px 0 16px} th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.host{border-top:2px solid #888;margin-top:24px;padding-top:8px}
.partial{background:#fff3cd;border:1px solid #e0c060;padding:6px 10px;margin:8px 0}
.regress{background:#f8d7da;border:1px solid #d08080;padding:6px 10px;margin:8px 0}
pre{white-space:pre-wrap;max-width:700px} .ok{color:#2a7a2a} code{background:#f5f5f5;padding:1px 4px} .cols{display:flex;gap:24px;flex-wrap:wrap}
"""

_TABLE_COLUMNS = (
    ("concurrency", "concurrency"), ("successful", "ok"), ("failed", "failed"),
    ("output_throughput", "output tok/s"), ("request_throughput", "req/s"), ("ttft_mean_ms", "TTFT mean ms"),
    ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p99_ms", "TTFT p99 ms"), ("decode_tps_p50", "decode tok/s/req p50"),
    ("tpot_mean_ms", "TPOT mean ms"), ("latency_p99_ms", "e2e p99 ms"), ("prompt_tokens_mean", "prompt tok"),
)


def _esc(value):
    return html.escape("-" if value is None else str(value))


def _kv_rows(plan):
    if not plan:
        return "<p>No KV-cache prediction for this host (gpu_preflight did not publish <code>gpu_preflight_result.kv_plan</code>).</p>"
    rows = []
    for key in sorted(plan):
        value = plan[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        rows.append("<tr><th class=l>%s</th><td class=l>%s</td></tr>" % (_esc(key), _esc(value)))
    return "<table>%s</table>" % "".join(rows)


def host_section(host):
    meta = host.get("meta") or {}
    parts = ["<section class=host id='host-%s'><h2>%s</h2>" % (_esc(host["name"]), _esc(host["name"]))]
    parts.append("<p class=meta>endpoint <code>%s</code> · model <code>%s</code> · vLLM <code>%s</code> · image "
                 "<code>%s</code></p>" % (_esc(host.get("url")), _esc(meta.get("model")),
                                          _esc(meta.get("vllm_version")), _esc(meta.get("image"))))
    if host.get("partial"):
        parts.append("<div class=partial><b>PARTIAL RESULTS.</b> %s</div>"
                     % "<br>".join(_esc(n) for n in (host.get("problems") or ["some requests failed"])))
    if host.get("regressions"):
        parts.append("<div class=regress><b>REGRESSION against the baseline:</b><br>%s</div>"
                     % "<br>".join(_esc(r) for r in host["regressions"]))
    elif host.get("baseline_compared"):
        parts.append("<p class=ok>Within the baseline's thresholds.</p>")
    head = "".join("<th>%s</th>" % _esc(label) for key, label in _TABLE_COLUMNS) + "<th class=l>errors</th>"
    body = []
    for level in host.get("levels") or []:
        cells = "".join("<td>%s</td>" % _esc(level.get(key)) for key, label in _TABLE_COLUMNS)
        errors = "; ".join("%s ×%d" % (e["error"], e["count"]) for e in level.get("errors") or [])
        body.append("<tr>%s<td class=l>%s</td></tr>" % (cells, _esc(errors) if errors else ""))
    if not body:
        body.append("<tr><td class=l colspan=%d>no level was measured</td></tr>" % (len(_TABLE_COLUMNS) + 1))
    parts.append("<h3>Measured</h3><table><tr>%s</tr>%s</table>" % (head, "".join(body)))
    flags = meta.get("args") or []
    parts.append("<div class=cols><div><h3>Server flags</h3><pre>%s</pre></div><div><h3>KV-cache prediction "
                 "(gpu_preflight)</h3>%s</div></div>" % (_esc(" ".join(str(a) for a in flags) or "unknown"),
                                                         _kv_rows(meta.get("kv_plan"))))
    parts.append("</section>")
    return "\n".join(parts)


DASHBOARD_FILE = "roles/monitoring/files/grafana/onprem-vllm-fleet.json"
DASHBOARD_UID = "onprem-vllm-fleet"


def dashboard_link(dashboard):
    """The report's pointer to the fleet's Grafana dashboard: a link at the run's time range when its URL is known,
    else the dashboard file to import. dashboard: {'url', 'from_ms', 'to_ms'} or None."""
    dashboard = dashboard or {}
    url = dashboard.get("url") or ""
    if url:
        href = "%s%sfrom=%d&to=%d" % (url, "&" if "?" in url else "?", dashboard.get("from_ms", 0), dashboard.get("to_ms", 0))
        return ("<p class=meta>Fleet dashboard during this run (KV cache, queues, TTFT/ITL, preemptions, gateway, Xid): "
                "<a href='%s'>%s</a></p>" % (_esc(href), _esc(url)))
    return ("<p class=meta>Fleet dashboard: import <code>%s</code> (uid <code>%s</code>) into Grafana with a Prometheus "
            "data source, or pass its URL as <code>onprem_vllm_benchmark_dashboard_url</code> to link it here.</p>"
            % (DASHBOARD_FILE, DASHBOARD_UID))


def html_report(run, hosts, plots):
    """One self-contained HTML page. run: {'run_id', 'started', 'settings', 'dashboard'}; plots: {'stem': svg(...)},
    drawn in CHARTS order."""
    settings = run.get("settings") or {}
    plots = "".join("<div class=plot id='plot-%s'>%s</div>" % (_esc(stem), plots[stem])
                    for stem, title, y_label, key in CHARTS if stem in plots) or (
        "<p class=meta>No charts in this report (vllm_benchmark ran with charts=false); the tables hold every "
        "measured value.</p>")
    status = "PARTIAL" if any(h.get("partial") for h in hosts) else "complete"
    setting_rows = "".join("<tr><th class=l>%s</th><td class=l>%s</td></tr>" % (_esc(k), _esc(v))
                           for k, v in sorted(settings.items()))
    return """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vLLM benchmark %(run)s</title><style>%(css)s</style></head>
<body>
<h1>vLLM benchmark — run %(run)s</h1>
<p class=meta>started %(started)s · %(n)d host(s) · results %(status)s · onprem.vllm</p>
%(dashboard)s
<div class=plots>%(plots)s</div>
<h2>Load</h2><table>%(settings)s</table>
%(hosts)s
</body></html>
""" % {"run": _esc(run.get("run_id")), "css": _CSS, "started": _esc(run.get("started")), "n": len(hosts),
       "status": status, "plots": plots, "settings": setting_rows, "dashboard": dashboard_link(run.get("dashboard")),
       "hosts": "\n".join(host_section(h) for h in hosts)}
