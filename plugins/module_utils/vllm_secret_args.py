# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find the vLLM API key in settings that would put it into argv or the container's environment (pure).

vLLM's argument parser reads `_` as `-` in flag names, accepts `--flag=value`, and (argparse's allow_abbrev) any
unambiguous prefix of a long flag (`--api-k`). The role hands the key to the server through a 0600 file instead.
"""
from __future__ import annotations

KEY_FLAG = "api-key"
# The shortest prefix argparse would expand to --api-key: `--api` and `--api-` also match --api-server-count.
_SHORTEST_ABBREVIATION = len("api-k")
SECRET_ENV_NAMES = ("VLLM_API_KEY",)


def _flag_name(arg: str) -> str | None:
    """'--api_key=x' → 'api-key'; 'x' → None. Only the name: the value never leaves this function."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0]
    name = name.split(None, 1)[0] if name.strip() else ""
    return name.split(".", 1)[0].replace("_", "-")


def key_flags(extra_args) -> list[str]:
    """The spellings of the API key flag in extra_args, as '--NAME' without any value."""
    found = []
    for arg in extra_args or []:
        name = _flag_name(str(arg))
        if name and len(name) >= _SHORTEST_ABBREVIATION and KEY_FLAG.startswith(name):
            found.append("--" + str(arg)[2:].split("=", 1)[0].split(None, 1)[0])
    return found


def secret_env_names(env) -> list[str]:
    """The names in env that vLLM reads the API key from."""
    return sorted(str(name) for name in (env or {}) if str(name).upper() in SECRET_ENV_NAMES)


def secret_settings_errors(extra_args, env) -> list[str]:
    """One message per setting that would expose the key; empty when none does."""
    errors = []
    flags = key_flags(extra_args)
    if flags:
        errors.append(
            f"vllm_server_extra_args carries the API key flag ({', '.join(flags)}): process arguments and docker "
            "inspect show it to everyone on the host. Remove it and set vllm_server_api_key (from Vault): the role "
            "hands the key to vLLM through a 0600 file mounted read-only.")
    names = secret_env_names(env)
    if names:
        errors.append(
            f"vllm_server_env sets {', '.join(names)}: the container's environment is shown by docker inspect. "
            "Remove it and set vllm_server_api_key (from Vault) instead.")
    return errors
