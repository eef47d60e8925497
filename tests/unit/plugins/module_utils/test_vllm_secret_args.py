import pytest

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_secret_args import (
    key_flags, secret_env_names, secret_settings_errors)


@pytest.mark.parametrize("args, flag", [
    (["--api-key", "s3cret-value"], "--api-key"),
    (["--api_key", "s3cret-value"], "--api_key"),
    (["--api-key=s3cret-value"], "--api-key"),
    (["--api_key=s3cret-value"], "--api_key"),
    (["--api-ke", "s3cret-value"], "--api-ke"),     # argparse expands an unambiguous prefix
    (["--api_k=s3cret-value"], "--api_k"),
    (["--api-key s3cret-value"], "--api-key"),     # one argv element with a space
])
def test_every_spelling_of_the_key_flag_is_found_without_its_value(args, flag):
    found = key_flags(["--enforce-eager"] + args)
    assert found == [flag]
    message = " ".join(secret_settings_errors(args, {}))
    assert flag in message and "s3cret-value" not in message
    assert "vllm_server_api_key" in message


@pytest.mark.parametrize("args", [
    ["--api-server-count", "2"],    # another flag that shares the prefix
    ["--api"],                      # ambiguous for argparse: not the key
    ["--enforce-eager", "--max-model-len=2048"],
    ["api-key"],                    # a value, not a flag
    [],
])
def test_other_flags_pass(args):
    assert key_flags(args) == []
    assert secret_settings_errors(args, {}) == []


def test_key_in_the_environment_is_refused_without_its_value():
    assert secret_env_names({"VLLM_API_KEY": "s3cret-value", "OMP_NUM_THREADS": "1"}) == ["VLLM_API_KEY"]
    assert secret_env_names({"vllm_api_key": "x"}) == ["vllm_api_key"]
    (message,) = secret_settings_errors([], {"VLLM_API_KEY": "s3cret-value"})
    assert "VLLM_API_KEY" in message and "s3cret-value" not in message


def test_both_faults_are_reported():
    assert len(secret_settings_errors(["--api-key=x"], {"VLLM_API_KEY": "x"})) == 2


def test_none_is_empty():
    assert secret_settings_errors(None, None) == []
