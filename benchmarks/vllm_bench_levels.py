# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run `vllm bench serve` once per argument list, in one process: the code path of the CLI (vLLM's own
`vllm.benchmarks.serve.add_cli_args` and `main`, which `vllm bench serve` calls), with vLLM imported once instead of
once per concurrency level (about 25 s per import on the borrowed GPU host).

  python3 benchmarks/vllm_bench_levels.py '[["--base-url", "...", "--max-concurrency", "1", ...], [...]]'
"""
from __future__ import annotations

import json
import sys


def main(argv):
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for args in json.loads(argv[0]):
        parser = FlexibleArgumentParser(description="vllm bench serve")
        add_cli_args(parser)
        bench_main(parser.parse_args(args))


if __name__ == "__main__":
    main(sys.argv[1:])
