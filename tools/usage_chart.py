# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Draw playbooks/usage.yml's CSV (gateway_usage_csv) as a chart: tokens per client, stacked by model, prompt and
completion apart; requests written on each bar. matplotlib on the machine that runs it (as for the benchmark report).

  python3 tools/usage_chart.py usage.csv usage.png [--title "Usage 2026-12-01 .. 2026-12-07"]
"""
from __future__ import annotations

import argparse
import csv
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("csv_file")
    parser.add_argument("png_file")
    parser.add_argument("--title", default="Tokens per client and model")
    args = parser.parse_args(argv)
    with open(args.csv_file, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise SystemExit("%s has no rows" % args.csv_file)
    # pylint: disable=import-outside-toplevel  # only this tool needs matplotlib
    from matplotlib.figure import Figure

    clients = sorted({row["client"] for row in rows})
    models = sorted({row["model"] for row in rows})
    figure = Figure(figsize=(11, 1.4 + 0.8 * len(clients)), dpi=110)
    axes = figure.add_subplot()
    palette = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd"]
    lefts = [0] * len(clients)
    for number, model in enumerate(models):
        for kind, hatch in (("prompt_tokens", None), ("completion_tokens", "//")):
            values = [sum(int(row[kind]) for row in rows if row["client"] == client and row["model"] == model)
                      for client in clients]
            if not any(values):
                continue  # an embedding model's completion tokens
            axes.barh(clients, values, left=lefts, color=palette[number % len(palette)], hatch=hatch,
                      edgecolor="white", label="%s, %s" % (model, kind.split("_", maxsplit=1)[0]))
            lefts = [left + value for left, value in zip(lefts, values)]
    for index, client in enumerate(clients):
        requests = sum(int(row["requests"]) for row in rows if row["client"] == client)
        axes.text(lefts[index], index, "  %d tokens, %d requests" % (lefts[index], requests), va="center")
    axes.set_xlim(0, max(lefts) * 1.5)
    axes.set_xlabel("tokens (hatched: completion)")
    axes.set_title(args.title)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    figure.savefig(args.png_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
