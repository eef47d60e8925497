# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark results as files people read: CSV per host, PNG line charts, one self-contained HTML report.

Standard library only: the control node needs no matplotlib. The charts are drawn on an RGB raster (lines, markers,
a 5x7 bitmap font scaled 2x) and encoded as PNG with zlib; the HTML embeds them as data: URIs, so the report is one
file that opens anywhere (no network, no scripts).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import struct
import zlib

CSV_FIELDS = (
    "host", "concurrency", "requests", "successful", "failed", "duration_s", "output_tokens", "prompt_tokens_mean",
    "output_throughput", "request_throughput", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "decode_tps_mean",
    "decode_tps_p50", "tpot_mean_ms", "itl_mean_ms", "latency_mean_ms", "latency_p99_ms", "errors",
)

# One color per host line (color-blind friendly: Okabe-Ito).
PALETTE = ((0, 114, 178), (230, 159, 0), (0, 158, 115), (204, 121, 167), (86, 180, 233), (213, 94, 0),
           (240, 228, 66), (0, 0, 0))

# 5x7 bitmap font, rows top to bottom, 1 = ink. Lower case letters are drawn as upper case.
_FONT_ROWS = {
    "0": "01110 10001 10011 10101 11001 10001 01110", "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111", "3": "11111 00010 00100 00010 00001 10001 01110",
    "4": "00010 00110 01010 10010 11111 00010 00010", "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110", "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110", "9": "01110 10001 10001 01111 00001 00010 01100",
    "A": "01110 10001 10001 10001 11111 10001 10001", "B": "11110 10001 10001 11110 10001 10001 11110",
    "C": "01110 10001 10000 10000 10000 10001 01110", "D": "11100 10010 10001 10001 10001 10010 11100",
    "E": "11111 10000 10000 11110 10000 10000 11111", "F": "11111 10000 10000 11110 10000 10000 10000",
    "G": "01110 10001 10000 10111 10001 10001 01111", "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110", "J": "00111 00010 00010 00010 00010 10010 01100",
    "K": "10001 10010 10100 11000 10100 10010 10001", "L": "10000 10000 10000 10000 10000 10000 11111",
    "M": "10001 11011 10101 10101 10001 10001 10001", "N": "10001 10001 11001 10101 10011 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110", "P": "11110 10001 10001 11110 10000 10000 10000",
    "Q": "01110 10001 10001 10001 10101 10010 01101", "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110", "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110", "V": "10001 10001 10001 10001 10001 01010 00100",
    "W": "10001 10001 10001 10101 10101 10101 01010", "X": "10001 10001 01010 00100 01010 10001 10001",
    "Y": "10001 10001 10001 01010 00100 00100 00100", "Z": "11111 00001 00010 00100 01000 10000 11111",
    " ": "00000 00000 00000 00000 00000 00000 00000", ".": "00000 00000 00000 00000 00000 01100 01100",
    ",": "00000 00000 00000 00000 01100 00100 01000", ":": "00000 01100 01100 00000 01100 01100 00000",
    "/": "00000 00001 00010 00100 01000 10000 00000", "-": "00000 00000 00000 11111 00000 00000 00000",
    "(": "00010 00100 01000 01000 01000 00100 00010", ")": "01000 00100 00010 00010 00010 00100 01000",
    "%": "11000 11001 00010 00100 01000 10011 00011", "_": "00000 00000 00000 00000 00000 00000 11111",
    "=": "00000 00000 11111 00000 11111 00000 00000", "+": "00000 00100 00100 11111 00100 00100 00000",
    "<": "00010 00100 01000 10000 01000 00100 00010", ">": "01000 00100 00010 00001 00010 00100 01000",
    "?": "01110 10001 00001 00010 00100 00000 00100",
}
FONT = {char: rows.split() for char, rows in _FONT_ROWS.items()}


# ------------------------------------------------------------------------------------------------------------------
# Raster + PNG


class Canvas:
    """An RGB raster with just enough drawing for a line chart."""

    def __init__(self, width, height, background=(255, 255, 255)):
        self.width, self.height = int(width), int(height)
        self.pixels = bytearray(bytes(background) * (self.width * self.height))

    def set(self, x, y, color):
        x, y = int(x), int(y)
        if 0 <= x < self.width and 0 <= y < self.height:
            idx = (y * self.width + x) * 3
            self.pixels[idx:idx + 3] = bytes(color)

    def get(self, x, y):
        idx = (int(y) * self.width + int(x)) * 3
        return tuple(self.pixels[idx:idx + 3])

    def rect(self, x0, y0, x1, y1, color):
        for y in range(int(y0), int(y1) + 1):
            for x in range(int(x0), int(x1) + 1):
                self.set(x, y, color)

    def line(self, x0, y0, x1, y1, color, width=1):
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        half = width // 2
        while True:
            if width <= 1:
                self.set(x0, y0, color)
            else:
                self.rect(x0 - half, y0 - half, x0 - half + width - 1, y0 - half + width - 1, color)
            if x0 == x1 and y0 == y1:
                break
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def dashed_hline(self, x0, x1, y, color, dash=4):
        for x in range(int(x0), int(x1) + 1):
            if (x // dash) % 2 == 0:
                self.set(x, y, color)

    def text(self, x, y, text, color=(0, 0, 0), scale=2):
        """Draw text with its top-left corner at (x, y). Returns the width drawn."""
        cursor = int(x)
        for char in str(text):
            rows = FONT.get(char) or FONT.get(char.upper()) or FONT["?"]
            for row_idx, row in enumerate(rows):
                for col_idx, bit in enumerate(row):
                    if bit == "1":
                        self.rect(cursor + col_idx * scale, y + row_idx * scale,
                                  cursor + col_idx * scale + scale - 1, y + row_idx * scale + scale - 1, color)
            cursor += 6 * scale
        return cursor - int(x)

    def text_vertical(self, x, y, text, color=(0, 0, 0), scale=2):
        """Text rotated 90 degrees counter-clockwise, reading bottom to top, starting at (x, y) = bottom-left."""
        cursor = int(y)
        for char in str(text):
            rows = FONT.get(char) or FONT.get(char.upper()) or FONT["?"]
            for row_idx, row in enumerate(rows):
                for col_idx, bit in enumerate(row):
                    if bit == "1":
                        px, py = x + row_idx * scale, cursor - col_idx * scale
                        self.rect(px, py - scale + 1, px + scale - 1, py, color)
            cursor -= 6 * scale

    def png(self):
        raw = bytearray()
        stride = self.width * 3
        for y in range(self.height):
            raw.append(0)
            raw += self.pixels[y * stride:(y + 1) * stride]

        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 9))
                + chunk(b"IEND", b""))


def text_width(text, scale=2):
    return len(str(text)) * 6 * scale


def nice_ceiling(value):
    """A round axis maximum >= value (1, 2, 2.5, 5 x 10^n)."""
    if value is None or value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        top = step * 10 ** exp
        if top >= value * 1.05:
            return float(top)
    return float(10 ** (exp + 1))


def format_number(value):
    if value is None:
        return "-"
    if abs(value) >= 100 or float(value).is_integer():
        return "%d" % round(value)
    if abs(value) >= 10:
        return "%.1f" % value
    return "%.2f" % value


def line_chart(title, x_label, y_label, series, width=900, height=500):
    """series: [(name, [(x, y or None), ...])]. x values are placed at equal spacing (categorical), sorted.

    Returns PNG bytes. A series with no value is listed in the legend as "(no data)".
    """
    canvas = Canvas(width, height)
    xs = sorted({x for name, points in series for x, y in points})
    ys = [y for name, points in series for x, y in points if y is not None]
    top = nice_ceiling(max(ys) if ys else 0)
    left, right, upper, lower = 110, width - 30, 60, height - 80
    ink, grid = (40, 40, 40), (220, 220, 220)
    canvas.text((width - text_width(title)) // 2, 16, title, ink)
    # Grid and y ticks
    ticks = 5
    for idx in range(ticks + 1):
        value = top * idx / ticks
        y = lower - (lower - upper) * idx / ticks
        if idx:
            canvas.dashed_hline(left, right, int(y), grid)
        label = format_number(value)
        canvas.text(left - 10 - text_width(label), int(y) - 7, label, ink)
    canvas.line(left, upper, left, lower, ink, 2)
    canvas.line(left, lower, right, lower, ink, 2)
    canvas.text_vertical(18, (upper + lower) // 2 + text_width(y_label) // 2, y_label, ink)
    canvas.text((left + right - text_width(x_label)) // 2, height - 30, x_label, ink)

    def x_pos(x):
        if len(xs) <= 1:
            return (left + right) / 2.0
        return left + 40 + (right - left - 80) * xs.index(x) / (len(xs) - 1)

    for x in xs:
        px = x_pos(x)
        canvas.line(px, lower, px, lower + 6, ink, 2)
        label = format_number(x)
        canvas.text(int(px) - text_width(label) // 2, lower + 12, label, ink)

    def y_pos(y):
        return lower - (lower - upper) * (y / top)

    legend_y = upper + 8
    for idx, (name, points) in enumerate(series):
        color = PALETTE[idx % len(PALETTE)]
        pts = [(x_pos(x), y_pos(y)) for x, y in sorted(points, key=lambda p: p[0]) if y is not None]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            canvas.line(x0, y0, x1, y1, color, 3)
        for px, py in pts:
            canvas.rect(px - 4, py - 4, px + 4, py + 4, color)
        label = str(name) + ("" if pts else " (no data)")
        canvas.rect(left + 16, legend_y + 3, left + 36, legend_y + 10, color)
        canvas.text(left + 44, legend_y, label, ink)
        legend_y += 22
    return canvas.png()


def png_size(data):
    """(width, height) of a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">II", data[16:24])


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


def charts(hosts):
    """{'throughput.png': bytes, 'ttft_p99.png': bytes} from [{'name', 'levels'}]."""
    throughput = [(h["name"], [(lv["concurrency"], lv.get("output_throughput")) for lv in h.get("levels") or []])
                  for h in hosts]
    ttft = [(h["name"], [(lv["concurrency"], lv.get("ttft_p99_ms")) for lv in h.get("levels") or []])
            for h in hosts]
    return {
        "throughput.png": line_chart("Output throughput vs concurrency", "concurrent requests",
                                     "output tokens/s (all requests)", throughput),
        "ttft_p99.png": line_chart("TTFT p99 vs concurrency", "concurrent requests", "p99 time to first token (ms)",
                                   ttft),
    }


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{margin-bottom:4px} .meta{color:#555;margin-top:0}
.plots{display:flex;flex-wrap:wrap;gap:16px} .plots img{width:660px;max-width:100%;border:1px solid #ddd}
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
        return "<p>No KV-cache prediction for this host (gpu_preflight did not publish <code>gpu_preflight_kv_plan</code>).</p>"
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


def html_report(run, hosts, images):
    """One self-contained HTML page. run: {'run_id', 'started', 'settings', 'dashboard'}; images: {'name.png': bytes}."""
    settings = run.get("settings") or {}
    plots = "".join("<img alt='%s' src='data:image/png;base64,%s'>" % (_esc(name), base64.b64encode(data).decode())
                    for name, data in sorted(images.items()))
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


def png_decode(data):
    """(width, height, channels, rows of bytes) of an 8-bit non-interlaced RGB/RGBA/grey PNG (e.g. a browser's
    screenshot), to check what a person would see without an imaging library."""
    width, height = png_size(data)
    bit_depth, color_type, interlace = data[24], data[25], data[28]
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color_type)
    if bit_depth != 8 or channels is None or interlace:
        raise ValueError("only 8-bit non-interlaced grey/RGB/RGBA PNGs are supported")
    pos, idat = 8, b""
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        kind = data[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        base = y * (stride + 1)
        kind, line = raw[base], bytearray(raw[base + 1:base + 1 + stride])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = prev[x]
            corner = prev[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                guess = left + up - corner
                pa, pb, pc = abs(guess - left), abs(guess - up), abs(guess - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def count_color(decoded, color, tolerance=24):
    """Pixels within `tolerance` (per channel) of an RGB color in a png_decode() result."""
    width, height, channels, rows = decoded
    found = 0
    for row in rows:
        for x in range(0, width * channels, channels):
            if channels >= 3 and all(abs(row[x + i] - color[i]) <= tolerance for i in range(3)):
                found += 1
    return found
