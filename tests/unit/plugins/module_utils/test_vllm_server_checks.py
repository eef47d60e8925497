# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""vllm_server's checks before the running server is touched (module_utils/vllm_server_checks.py); the role's test
(tests/unit/roles/test_vllm_server_validate.py) runs them through the action against a real Docker engine."""
from __future__ import annotations

from ansible_collections.onprem.vllm.plugins.module_utils.vllm_server_checks import port_is_ours, refusals

SETTINGS = {"image_tag": "v0.33.0", "model": "Qwen/Qwen3-8B", "served_model_name": "qwen3", "port": 8000}
GOOD = dict(host_name="ws1", container_name="vllm", settings=SETTINGS,
            api_key="k-0123456789abcdef", api_key_rotation="", bind_address="0.0.0.0", port=8000, cpu_mode=False,
            gpu_count=2, gpu_uuids=["GPU-a", "GPU-b"], model="Qwen/Qwen3-8B", model_revision="a" * 40,
            hf_cache_path="/var/lib/onprem-vllm/hf", snapshot_config="/hf/config.json", tls_clients="", extra_args=[],
            env={})
OURS = {"exists": True, "container": {"HostConfig": {"PortBindings": {"8000/tcp": [{"HostIp": "", "HostPort": "8000"}]}}}}
HOST = {"containers": {"vllm": OURS}, "port_listening": True, "paths": {"/hf/config.json": True}}


def test_a_good_plan_on_its_own_running_server_passes():
    assert refusals(GOOD, HOST) == []
    assert refusals(dict(GOOD, snapshot_config=""), {"containers": {}, "port_listening": False}) == []


def test_every_refusal_at_once():
    bad = dict(GOOD, settings=dict(GOOD["settings"], image_tag="latest"), api_key="REPLACE ME", gpu_uuids=["GPU-a"],
               model_revision="main", tls_clients="paste here", extra_args=["--api-key", "x"],
               env={"VLLM_API_KEY": "x"})
    found = refusals(bad, {"containers": {"vllm": {"exists": False}}, "port_listening": True,
                           "paths": {"/hf/config.json": False}})
    for expected in ("vllm_server_image_tag must pin a release", "vllm_server_api_key must be one string",
                     "= 2 GPUs, but 1 are assigned (GPU-a)", "not 'main'", "vllm_server_tls_clients must hold PEM",
                     "carries the API key flag (--api-key)", "vllm_server_env sets VLLM_API_KEY",
                     "Port 8000 on ws1 is in use by something other than the vllm container",
                     "Revision main of Qwen/Qwen3-8B is not in the cache at /var/lib/onprem-vllm/hf"):
        assert [message for message in found if expected in message], expected
    assert len(found) == 9


def test_the_keys_and_where_the_server_listens():
    assert refusals(dict(GOOD, api_key="", bind_address="127.0.0.1"), HOST) == []
    [open_port] = refusals(dict(GOOD, api_key=""), HOST)
    assert open_port.startswith("vllm_server_bind_address=0.0.0.0 exposes the server beyond this host")
    [rotation] = refusals(dict(GOOD, api_key="", bind_address="::1", api_key_rotation="next-key"), HOST)
    assert rotation.startswith("vllm_server_api_key_rotation is set but vllm_server_api_key is empty")
    assert refusals(dict(GOOD, api_key_rotation=["a", "list"]), HOST)[0].startswith(
        "vllm_server_api_key_rotation (the plan's onprem_vllm_api_key_rotation) must be one string")
    assert refusals(dict(GOOD, api_key="line\nbreak"), HOST)[0].startswith("vllm_server_api_key must be one string")


def test_cpu_mode_takes_no_gpu_and_pem_clients_pass():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    assert refusals(dict(GOOD, cpu_mode=True, gpu_uuids=[], tls_clients=pem), HOST) == []


def test_the_port_is_ours_only_where_our_container_publishes_it():
    assert port_is_ours(OURS["container"], 8000) and port_is_ours(OURS["container"], "8000")
    assert not port_is_ours(OURS["container"], 8001)
    assert not port_is_ours(None, 8000)
    assert not port_is_ours({"HostConfig": {"PortBindings": {"8000/tcp": None}}}, 8000)
    # Our container under another port: the listener on ours is someone else's.
    found = refusals(dict(GOOD, port=8001, settings=dict(GOOD["settings"], port=8001)), HOST)
    assert found and found[0].startswith("Port 8001 on ws1 is in use")
