# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run `vllm bench serve` once per argument list read from stdin (one JSON list per line), in one long-lived
process: the code path of the CLI (vLLM's own `vllm.benchmarks.serve.add_cli_args` and `main`, which `vllm bench
serve` calls), with vLLM imported once instead of once per run (about 25 s per import on the borrowed GPU host), so
that compare_vllm_bench.py can hand it one concurrency level at a time, taking turns with our client.

  python3 benchmarks/vllm_bench_levels.py < runs.jsonl

Prints READY once vLLM is imported and DONE after each run, each on a line of its own.
"""
from __future__ import annotations

import json
import sys

READY = "onprem-vllm-compare: ready"
DONE = "onprem-vllm-compare: done"


def main():
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    print(READY, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser(description="vllm bench serve")
        add_cli_args(parser)
        bench_main(parser.parse_args(json.loads(line)))
        print(DONE, flush=True)


if __name__ == "__main__":
    main()
