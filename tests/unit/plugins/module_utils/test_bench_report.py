# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report builder: PNG charts that decode and show each host's line, CSV, one self-contained HTML page."""
from __future__ import annotations

import base64
import re

from ansible_collections.onprem.vllm.plugins.module_utils import bench_report as br

LEVELS = [{"concurrency": c, "successful": 8, "failed": 0, "output_throughput": 100.0 * c, "ttft_p99_ms": 10.0 + c,
           "ttft_mean_ms": 5.0, "ttft_p50_ms": 6.0, "errors": []} for c in (1, 4, 8)]
HOSTS = [{"name": "ws1", "url": "http://a/v1/chat/completions", "levels": LEVELS, "partial": False,
          "meta": {"vllm_version": "v0.32.0", "model": "m", "args": ["--max-num-seqs", "16"],
                   "kv_plan": {"kv_cache_tokens": 1048576}}},
         {"name": "ws2", "url": "http://b/v1/chat/completions", "levels": LEVELS[:1], "partial": True,
          "problems": ["ws2: 0 of 8 requests succeeded at concurrency 4 (HTTP 401)"], "meta": {}}]


def test_line_chart_is_a_png_with_each_host_color():
    png = br.charts(HOSTS)["throughput.png"]
    assert br.png_size(png) == (900, 500)
    decoded = br.png_decode(png)
    assert br.count_color(decoded, br.PALETTE[0], 0) > 200  # ws1's line and markers
    assert br.count_color(decoded, br.PALETTE[1], 0) > 50   # ws2: one marker + legend


def test_empty_series_still_draws_axes():
    decoded = br.png_decode(br.line_chart("t", "x", "y", [("h", [(1, None)])]))
    assert br.count_color(decoded, (40, 40, 40), 0) > 500


def test_csv_has_a_row_per_level():
    text = br.levels_csv("ws1", LEVELS)
    assert text.splitlines()[0].startswith("host,concurrency") and len(text.splitlines()) == 4


def test_html_is_self_contained_with_tables_meta_and_partial_mark():
    images = br.charts(HOSTS)
    page = br.html_report({"run_id": "r1", "started": "now", "settings": {"max_tokens": 64}}, HOSTS, images)
    assert "http://" not in re.sub(r"<code>[^<]*</code>", "", page).replace("http://a", "").replace("http://b", "")
    srcs = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(srcs) == 2 and all(base64.b64decode(s).startswith(b"\x89PNG") for s in srcs)
    assert "v0.32.0" in page and "--max-num-seqs 16" in page and "kv_cache_tokens" in page
    assert "PARTIAL RESULTS" in page and "results PARTIAL" in page
    assert "<script" not in page


def test_report_links_to_the_fleet_dashboard_at_the_run_time_range():
    run = {"run_id": "r1", "started": "now", "settings": {},
           "dashboard": {"url": "https://grafana.example.org/d/onprem-vllm-fleet", "from_ms": 1000, "to_ms": 2000}}
    page = br.html_report(run, HOSTS, {})
    assert "<a href='https://grafana.example.org/d/onprem-vllm-fleet?from=1000&amp;to=2000'>" in page


def test_report_without_a_dashboard_url_names_the_file_to_import():
    page = br.html_report({"run_id": "r1", "started": "now", "settings": {}}, HOSTS, {})
    assert "import <code>roles/monitoring/files/grafana/onprem-vllm-fleet.json</code>" in page
    import os
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    assert os.path.exists(os.path.join(root, br.DASHBOARD_FILE))
