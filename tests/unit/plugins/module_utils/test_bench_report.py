# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The report builder: matplotlib charts with each host's line at its measured values, CSV, one self-contained page."""
from __future__ import annotations

import importlib.util
import io
import math
import os
import re
import xml.etree.ElementTree as ET

import numpy
import pytest
from PIL import Image

from ansible_collections.onprem.vllm.plugins.module_utils import bench_report as br

SVG = "{http://www.w3.org/2000/svg}"
LEVELS = [{"concurrency": c, "successful": 8, "failed": 0, "output_throughput": 100.0 * c, "ttft_p99_ms": 10.0 + c * c,
           "ttft_mean_ms": 5.0, "ttft_p50_ms": 6.0, "errors": []} for c in (1, 4, 8)]
HOSTS = [{"name": "ws1", "url": "http://a/v1/chat/completions", "levels": LEVELS, "partial": False,
          "meta": {"vllm_version": "v0.32.0", "model": "m", "args": ["--max-num-seqs", "16"],
                   "kv_plan": {"kv_cache_tokens": 1048576}}},
         {"name": "ws2", "url": "http://b/v1/chat/completions", "levels": LEVELS[:1], "partial": True,
          "problems": ["ws2: 0 of 8 requests succeeded at concurrency 4 (HTTP 401)"], "meta": {}}]


def svg_tree(stem, hosts=None):
    return ET.fromstring(br.svg(br.charts(HOSTS if hosts is None else hosts)[stem]))


def markers(tree, gid):
    """(x, y) of the markers of one host's line, in drawing order (SVG y grows downwards)."""
    group = tree.find(".//%sg[@id='%s']" % (SVG, gid))
    assert group is not None, "no line %s in the chart" % gid
    return [(float(u.get("x")), float(u.get("y"))) for u in group.iter(SVG + "use")]


def texts(tree):
    return [" ".join("".join(t.itertext()).split()) for t in tree.iter(SVG + "text")]


@pytest.mark.parametrize("stem,key", [("throughput", "output_throughput"), ("ttft_p99", "ttft_p99_ms")])
def test_each_host_is_one_line_through_its_measured_values_in_order(stem, key):
    tree = svg_tree(stem)
    ws1, ws2 = markers(tree, stem + "-host-ws1"), markers(tree, stem + "-host-ws2")
    assert len(ws1) == 3 and len(ws2) == 1
    (x0, y0), (x1, y1), (x2, y2) = ws1
    values = [lv[key] for lv in LEVELS]
    # Heights above the first point are proportional to the values (linear y from 0) ...
    assert (y0 - y1) / (y0 - y2) == pytest.approx((values[1] - values[0]) / (values[2] - values[0]), rel=1e-3)
    # ... and concurrency 1, 4, 8 sits on a log2 axis.
    assert (x1 - x0) / (x2 - x0) == pytest.approx(math.log2(4) / math.log2(8), rel=1e-3)
    assert ws2[0] == pytest.approx(ws1[0], abs=0.01)  # ws2's one level: same concurrency, same value
    line = tree.find(".//%sg[@id='%s-host-ws1']/%spath" % (SVG, stem, SVG))
    assert "stroke: %s" % br.hex_color(br.PALETTE[0]) in line.get("style")


def test_charts_have_title_axis_labels_ticks_and_a_legend_naming_the_hosts():
    for stem, title, y_label, key in br.CHARTS:
        found = texts(svg_tree(stem))
        assert {title, y_label, br.X_LABEL, "host", "ws1", "ws2", "1", "4", "8"} <= set(found), found
        assert "0" in found  # the y axis starts at zero


def test_a_host_without_values_is_named_in_the_legend_and_an_empty_run_says_so():
    hosts = [HOSTS[0], {"name": "down", "levels": [{"concurrency": 1, "output_throughput": None}]}]
    tree = svg_tree("throughput", hosts)
    assert "down (no data)" in texts(tree) and markers(tree, "throughput-host-down") == []
    assert "no level was measured" in texts(svg_tree("throughput", [{"name": "down", "levels": []}]))


def test_png_file_shows_the_host_line_color():
    image = Image.open(io.BytesIO(br.png(br.charts(HOSTS)["throughput"]))).convert("RGB")
    assert image.size == (960, 540)
    pixels = numpy.asarray(image, dtype=int)
    assert int((abs(pixels - br.PALETTE[0]) <= 24).all(axis=2).sum()) > 1000
    assert int((abs(pixels - br.PALETTE[1]) <= 24).all(axis=2).sum()) > 50  # ws2: one marker + legend


def test_svg_is_the_same_for_the_same_data():
    assert br.svg(br.charts(HOSTS)["ttft_p99"]) == br.svg(br.charts(HOSTS)["ttft_p99"])


def test_csv_has_a_row_per_level():
    text = br.levels_csv("ws1", LEVELS)
    assert text.splitlines()[0].startswith("host,concurrency") and len(text.splitlines()) == 4


def test_html_is_self_contained_with_both_charts_tables_meta_and_partial_mark():
    plots = {stem: br.svg(figure) for stem, figure in br.charts(HOSTS).items()}
    page = br.html_report({"run_id": "r1", "started": "now", "settings": {"max_tokens": 64}}, HOSTS, plots)
    assert re.findall(r"<div class=plot id='plot-([a-z0-9_]+)'><svg", page) == ["throughput", "ttft_p99"]
    # Nothing is fetched: every reference is to an id inside the page.
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", page) + re.findall(r"url\(([^)]*)\)", page)
    assert refs and all(ref.startswith("#") for ref in refs), refs
    assert not re.search(r"<(script|link|img|iframe|object)\b|@import", page)
    assert "v0.32.0" in page and "--max-num-seqs 16" in page and "kv_cache_tokens" in page
    assert "PARTIAL RESULTS" in page and "results PARTIAL" in page


def test_report_links_to_the_fleet_dashboard_at_the_run_time_range():
    run = {"run_id": "r1", "started": "now", "settings": {},
           "dashboard": {"url": "https://grafana.example.org/d/onprem-vllm-fleet", "from_ms": 1000, "to_ms": 2000}}
    page = br.html_report(run, HOSTS, {})
    assert "<a href='https://grafana.example.org/d/onprem-vllm-fleet?from=1000&amp;to=2000'>" in page


def test_report_without_a_dashboard_url_names_the_file_to_import():
    page = br.html_report({"run_id": "r1", "started": "now", "settings": {}}, HOSTS, {})
    assert "import <code>roles/monitoring/files/grafana/onprem-vllm-fleet.json</code>" in page
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
    assert os.path.exists(os.path.join(root, br.DASHBOARD_FILE))


def test_without_matplotlib_the_module_imports_and_the_charts_say_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib now raises ImportError
    spec = importlib.util.spec_from_file_location("bench_report_without_matplotlib", br.__file__)
    bare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bare)
    assert bare.HAS_MATPLOTLIB is False and "matplotlib" in bare.MATPLOTLIB_IMPORT_ERROR
    with pytest.raises(bare.ChartError, match="need matplotlib in the Python that builds the report"):
        bare.charts(HOSTS)
    assert "ws1" in bare.html_report({"run_id": "r1", "settings": {}}, HOSTS, {})  # the page itself needs no library


@pytest.mark.parametrize("value,label", [(0, "0"), (0.25, "0.25"), (12.5, "12.5"), (1500, "1,500"),
                                         (2000000, "2,000,000")])
def test_y_tick_labels_read_as_plain_numbers(value, label):
    assert br._tick_label(value) == label
