# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """Where the GPU modules (gpu_topology_info, gpu_health_info) read the GPUs from."""

    DOCUMENTATION = r"""
options:
  backend:
    description:
      - Where GPU facts come from. C(auto) uses NVML when nvidia-ml-py is importable, else nvidia-smi.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  nvidia_smi_path:
    description:
      - Path of the nvidia-smi binary. Default is the one found on E(PATH).
    type: path
"""
