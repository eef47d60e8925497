# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How small a change of a model's weights the known-answer gate catches, measured on the lab's CPU vLLM.

Serves the lab's tiny model as it is (the reference answers), then copies of it where ONE weight tensor has Gaussian
noise added, its standard deviation a fraction EPS of the tensor's own root mean square (the same seed each time), and
compares each copy's answers with the reference by the gate's own rule and default tolerance
(plugins/module_utils/known_answers.py). Prints, per tensor and EPS, whether the gate failed the copy and the largest
logprob change on the common prefix.

  python3 benchmarks/known_answers_sensitivity.py [--image vllm/vllm-openai:v0.32.0]
      [--tensor model.layers.0.mlp.down_proj.weight] [--eps 0.3 0.1 0.03 0.01 0.003 0.001] [--out result.json]

Needs Docker and the lab's artifacts (`make lab-artifacts`: the serving image and the tiny checkpoint under
lab/build/share). Each copy is one start of the server (about 20-45 s on 2 idle cores). Nothing leaves this machine.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import struct

import numpy

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, ".collections"))
from ansible_collections.onprem.vllm.plugins.module_utils import known_answers as ka  # noqa: E402
from ansible_collections.onprem.vllm.plugins.module_utils.vllm_gate import Response  # noqa: E402

CHECKPOINT = os.path.join(ROOT, "lab", "build", "share", "hf-seed", "hub", "models--onprem-lab--tiny-qwen3",
                          "snapshots", "*")
# The lab's CPU settings (inventories/lab/group_vars/all/lab.yml and plan.yml).
ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
       "TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
ARGS = ["--served-model-name", "q", "--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "4"]
# The gate's defaults (roles/vllm_server/defaults/main.yml, vllm_server_known_answers_*).
POSITIONS, TOP_LOGPROBS = 16, 5
TOLERANCE = {"positions": POSITIONS, "max_logprob_delta": 0.5, "tie_margin": 0.5, "min_cosine": 0.995}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def perturbed_copy(source: str, target: str, tensor: str, eps: float, seed: int = 0) -> None:
    """A copy of the checkpoint folder with noise of relative size eps added to one BF16 tensor (eps 0: unchanged),
    written in place in the safetensors file (8-byte header length, JSON header, raw little-endian data)."""
    shutil.copytree(source, target, copy_function=shutil.copy)
    if eps == 0:
        return
    path = os.path.join(target, "model.safetensors")
    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        if tensor not in header or header[tensor]["dtype"] != "BF16":
            raise SystemExit(f"no BF16 tensor {tensor} in the checkpoint; it has: "
                             f"{', '.join(sorted(k for k in header if k != '__metadata__'))}")
        start, end = header[tensor]["data_offsets"]
        handle.seek(8 + length + start)
        raw = numpy.frombuffer(handle.read(end - start), dtype="<u2")
        values = (raw.astype(numpy.uint32) << 16).view(numpy.float32)
        rms = float(numpy.sqrt(numpy.mean(values * values)))
        noisy = values + numpy.random.default_rng(seed).standard_normal(values.shape).astype(numpy.float32) * eps * rms
        bits = noisy.astype(numpy.float32).view(numpy.uint32)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")  # to BF16, round to nearest even
        handle.seek(8 + length + start)
        handle.write(rounded.tobytes())


def answers(image: str, folder: str) -> list:
    """Start the server on the folder, ask the gate's prompts one at a time, stop it."""
    port, name = free_port(), "ka-sensitivity-%d" % os.getpid()
    env = [item for key, value in ENV.items() for item in ("-e", f"{key}={value}")]
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8000", *env,
                    "-v", f"{folder}:/model:ro", image, "/model", *ARGS], check=True, capture_output=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False)
                    raise SystemExit("the server did not start: " + (logs.stdout + logs.stderr)[-3000:])
                time.sleep(1)

        def http(method, path, body):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"}, method=method)
            try:
                with urllib.request.urlopen(request, timeout=300) as resp:
                    return Response(resp.getcode(), resp.read().decode())
            except urllib.error.HTTPError as exc:
                return Response(exc.code, exc.read().decode())

        return ka.ask_all(http, "generate", "q", ka.DEFAULT_PROMPTS, POSITIONS, TOP_LOGPROBS)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def largest_change(recorded: list, observed: list) -> float:
    """The largest logprob difference over the positions where both answers chose the same token."""
    largest = 0.0
    for rec, obs in zip(recorded, observed):
        for rec_token, obs_token, rec_lp, obs_lp in zip(rec["tokens"], obs["tokens"], rec["logprobs"], obs["logprobs"]):
            if rec_token != obs_token:
                break
            largest = max(largest, abs(rec_lp - obs_lp))
    return round(largest, 4)


def other_tokens(recorded: list, observed: list) -> int:
    """How many answers chose another token somewhere in the compared positions (a flip the gate may have allowed)."""
    return sum(rec["tokens"][:POSITIONS] != obs["tokens"][:POSITIONS] for rec, obs in zip(recorded, observed))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default="vllm/vllm-openai:v0.32.0")
    parser.add_argument("--tensor", action="append", default=[])
    parser.add_argument("--eps", type=float, nargs="+", default=[0.3, 0.1, 0.03, 0.01, 0.003, 0.001])
    parser.add_argument("--out")
    args = parser.parse_args()
    tensors = args.tensor or ["model.layers.0.mlp.down_proj.weight", "model.norm.weight"]
    sources = glob.glob(CHECKPOINT)
    if len(sources) != 1:
        raise SystemExit(f"expected one snapshot of the lab's tiny model under {CHECKPOINT}: make lab-artifacts")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ka-sensitivity-") as work:
        base = os.path.join(work, "base")
        perturbed_copy(sources[0], base, "", 0)
        reference = answers(args.image, base)
        for tensor in tensors:
            for eps in args.eps:
                folder = os.path.join(work, f"{tensor}-{eps}")
                perturbed_copy(sources[0], folder, tensor, eps)
                observed = answers(args.image, folder)
                failures = ka.compare(reference, observed, ka.DEFAULT_PROMPTS, **TOLERANCE)
                row = {"tensor": tensor, "eps": eps, "gate": "failed" if failures else "passed",
                       "failed_prompts": len(failures), "largest_logprob_change": largest_change(reference, observed),
                       "answers_with_other_tokens": other_tokens(reference, observed),
                       "first_failure": failures[0][:300] if failures else ""}
                rows.append(row)
                print(json.dumps(row), flush=True)
                shutil.rmtree(folder)
    caught = {t: min((r["eps"] for r in rows if r["tensor"] == t and r["gate"] == "failed"), default=None)
              for t in tensors}
    print("smallest noise (relative to the tensor's RMS) the gate caught: " + json.dumps(caught))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"image": args.image, "tolerance": TOLERANCE, "rows": rows, "smallest_caught": caught,
                       "reference": reference}, handle,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
