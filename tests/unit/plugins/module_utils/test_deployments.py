# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

import copy

import pytest

from ansible_collections.onprem.vllm.plugins.module_utils import deployments
from ansible_collections.onprem.vllm.plugins.module_utils.deployments import (
    PlanError,
    SHARED_GPU_UTILIZATION_LIMIT,
    fleet_errors,
    gpu_count,
    normalize,
    on_host,
    placement_errors,
    served_names,
)

FLEET = {
    "image": "vllm/vllm-openai",
    "image_tag": "v0.32.0",
    "image_digest": "",
    "image_cuda": "12.8",
    "model": "Qwen/Qwen3-30B-A3B-FP8",
    "model_revision": "main",
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "enable_expert_parallel": False,
    "max_model_len": 32768,
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 64,
    "gpu_memory_utilization": 0.9,
    "kv_cache_dtype": "auto",
    "kv_cache_memory": "",
    "enforce_eager": False,
    "cpu_kv_cache_space_gib": 4,
}

ALL_KEYS = deployments.KNOWN_KEYS


def plan(items, overrides=None, fleet=None, **kwargs):
    return normalize(items, dict(FLEET if fleet is None else fleet), overrides, **kwargs)


def by_name(result):
    return {d["name"]: d for d in result}


def three_deployments():
    """A valid plan: chat on two GPUs, embed on chat's GPU 0, router on a group of its own."""
    return plan([
        {"name": "chat", "tensor_parallel_size": 2, "gpu_memory_utilization": 0.82, "port": 8000},
        {"name": "embed", "model": "BAAI/bge-m3", "runner": "pooling", "shares_gpu_with": "chat",
         "shared_gpu_index": 0, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.08,
         "kv_cache_memory": "auto", "port": 8001},
        {"name": "router", "model": "Qwen/Qwen3-0.6B", "tensor_parallel_size": 1, "hosts": "router_servers",
         "port": 8002},
    ])


def deployment(name, **changes):
    """One complete deployment (as normalize returns it), with changes."""
    [result] = plan([{"name": name, **changes}])
    return result


# --- normalize: the one-model plan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("empty", [None, []])
def test_no_deployments_is_one_default_deployment(empty):
    result = normalize(empty, dict(FLEET), None, container_name="vllm-main", port=8100,
                       served_model_name="qwen3-30b")
    assert len(result) == 1
    [single] = result
    assert set(single) == ALL_KEYS
    assert single["name"] == "default" == deployments.SINGLE_NAME
    assert single["container_name"] == "vllm-main"
    assert single["port"] == 8100
    assert single["served_model_name"] == "qwen3-30b"
    assert single["hosts"] == "vllm_servers"
    for key, value in FLEET.items():
        assert single[key] == value, key
    assert single["served_model_aliases"] == []
    assert single["runner"] == "generate"
    assert single["extra_args"] == []
    assert single["env"] == {}
    assert single["shares_gpu_with"] == ""
    assert single["shared_gpu_index"] == 0


def test_one_model_plan_defaults():
    [single] = normalize(None, {})
    assert single["container_name"] == "vllm"
    assert single["port"] == 8000
    assert single["served_model_name"] == ""
    # Fleet keys that the fleet does not state are None (left to vLLM or validated elsewhere).
    assert all(single[key] is None for key in deployments.FLEET_KEYS)


def test_one_model_plan_takes_its_override():
    [single] = normalize(None, dict(FLEET), {"default": {"port": "9000", "max_num_seqs": 8}})
    assert single["port"] == 9000
    assert single["max_num_seqs"] == 8


def test_one_model_plan_refuses_an_override_naming_no_deployment():
    with pytest.raises(PlanError, match="names no deployment of the plan: chat"):
        normalize(None, dict(FLEET), {"chat": {"port": 9000}})


# --- normalize: a list ---------------------------------------------------------------------------------------------

def test_list_items_complete_from_fleet_values():
    result = plan([{"name": "chat"}, {"name": "embed", "runner": "pooling"}],
                  container_name="vllm", port=8000, served_model_name="")
    assert [d["name"] for d in result] == ["chat", "embed"]
    chat, embed = result
    for d in result:
        assert set(d) == ALL_KEYS
        for key, value in FLEET.items():
            assert d[key] == value, (d["name"], key)
        assert d["port"] == 8000
        assert d["hosts"] == "vllm_servers"
        assert d["served_model_aliases"] == []
        assert d["extra_args"] == []
        assert d["env"] == {}
        assert d["shares_gpu_with"] == ""
        assert d["shared_gpu_index"] == 0
    assert chat["served_model_name"] == "chat"
    assert embed["served_model_name"] == "embed"
    assert chat["container_name"] == "vllm-chat"
    assert embed["container_name"] == "vllm-embed"
    assert chat["runner"] == "generate"
    assert embed["runner"] == "pooling"


def test_list_items_take_the_fleet_served_name_when_it_is_set():
    chat, embed = plan([{"name": "chat"}, {"name": "embed", "served_model_name": "emb"}], served_model_name="qwen3")
    assert (chat["served_model_name"], embed["served_model_name"]) == ("qwen3", "emb")
    # Two items left on the fleet's name would answer to one model name: the fleet check names both.
    both = plan([{"name": "chat"}, {"name": "router", "port": 8001}], served_model_name="qwen3")
    assert any("chat and router both answer to the model name qwen3" in e for e in fleet_errors(both))


def test_list_container_name_and_port_default_from_the_one_model_plan_values():
    [chat] = plan([{"name": "chat"}], container_name="llm", port=8100)
    assert chat["container_name"] == "llm-chat"
    assert chat["port"] == 8100


def test_item_values_win_over_fleet_values():
    [chat] = plan([{"name": "chat", "model": "meta/llama", "tensor_parallel_size": 4, "gpu_memory_utilization": 0.5,
                    "served_model_name": "llama", "container_name": "my-chat", "port": 9001,
                    "hosts": "gpu_big", "served_model_aliases": ["gpt"], "env": {"A": "1"}}])
    assert chat["model"] == "meta/llama"
    assert chat["tensor_parallel_size"] == 4
    assert chat["gpu_memory_utilization"] == 0.5
    assert chat["served_model_name"] == "llama"
    assert chat["container_name"] == "my-chat"
    assert chat["port"] == 9001
    assert chat["hosts"] == "gpu_big"
    assert chat["served_model_aliases"] == ["gpt"]
    assert chat["env"] == {"A": "1"}
    # What the item does not state still comes from the fleet.
    assert chat["image_tag"] == FLEET["image_tag"]
    assert chat["max_model_len"] == FLEET["max_model_len"]


def test_port_given_as_a_string_becomes_a_number():
    [chat] = plan([{"name": "chat", "port": "8005"}])
    assert chat["port"] == 8005


def test_port_that_is_not_a_number_is_kept_for_placement_errors_to_report():
    [chat] = plan([{"name": "chat", "port": "http"}])
    assert chat["port"] == "http"


def test_overrides_apply_last():
    result = plan([{"name": "chat", "max_num_seqs": 32, "port": 8000}, {"name": "embed", "port": 8001}],
                  overrides={"chat": {"max_num_seqs": 16, "port": "8010", "env": {"B": "2"}},
                             "embed": {"gpu_memory_utilization": 0.1}})
    chat, embed = by_name(result)["chat"], by_name(result)["embed"]
    assert chat["max_num_seqs"] == 16
    assert chat["port"] == 8010
    assert chat["env"] == {"B": "2"}
    assert chat["gpu_memory_utilization"] == FLEET["gpu_memory_utilization"]
    assert embed["gpu_memory_utilization"] == 0.1
    assert embed["max_num_seqs"] == FLEET["max_num_seqs"]
    assert embed["port"] == 8001


def test_override_may_be_empty():
    [chat] = plan([{"name": "chat"}], overrides={"chat": None})
    assert chat["max_num_seqs"] == FLEET["max_num_seqs"]


def test_override_naming_no_deployment_is_refused():
    with pytest.raises(PlanError) as exc:
        plan([{"name": "chat"}], overrides={"chat": {"port": 9000}, "embed": {"port": 9001}, "rerank": {}})
    assert str(exc.value) == "onprem_vllm_deployment_overrides names no deployment of the plan: embed, rerank"


def test_override_setting_name_is_refused():
    with pytest.raises(PlanError) as exc:
        plan([{"name": "chat"}], overrides={"chat": {"name": "other"}})
    assert str(exc.value) == "onprem_vllm_deployment_overrides.chat: cannot set name"


def test_override_setting_unknown_keys_is_refused():
    with pytest.raises(PlanError) as exc:
        plan([{"name": "chat"}], overrides={"chat": {"tp": 2, "gpus": 1, "port": 9000}})
    assert str(exc.value) == "onprem_vllm_deployment_overrides.chat: cannot set gpus, tp"


def test_override_setting_unknown_keys_and_name_lists_both():
    with pytest.raises(PlanError, match=r"overrides\.chat: cannot set tp, name$"):
        plan([{"name": "chat"}], overrides={"chat": {"tp": 2, "name": "x"}})


def test_override_that_is_not_a_mapping_is_refused():
    with pytest.raises(PlanError, match=r"onprem_vllm_deployment_overrides\.chat must be a mapping"):
        plan([{"name": "chat"}], overrides={"chat": ["port", 9000]})


def test_overrides_that_are_not_a_mapping_are_refused():
    with pytest.raises(PlanError, match="onprem_vllm_deployment_overrides must be a mapping"):
        plan([{"name": "chat"}], overrides=[{"chat": {}}])


@pytest.mark.parametrize("value", [{"name": "chat"}, "chat", ("chat",)])
def test_deployments_must_be_a_list(value):
    with pytest.raises(PlanError, match="onprem_vllm_deployments must be a list of deployments"):
        plan(value)


@pytest.mark.parametrize("item, type_name", [("chat", "str"), (["chat"], "list"), (3, "int")])
def test_each_item_must_be_a_mapping(item, type_name):
    with pytest.raises(PlanError) as exc:
        plan([{"name": "chat"}, item])
    assert str(exc.value) == f"onprem_vllm_deployments[1] must be a mapping, got {type_name}"


@pytest.mark.parametrize("name", ["Chat", "1x", "a.b", "a" * 32, "", "-chat", "chat_1", "chat bot", None, 7])
def test_bad_names_are_refused(name):
    item = {"model": "m"} if name is None else {"name": name}
    with pytest.raises(PlanError) as exc:
        plan([{"name": "ok"}, item])
    message = str(exc.value)
    assert message.startswith("onprem_vllm_deployments[1].name must be a short lower-case name")
    assert f"got {name!r}" in message
    assert "a-z, 0-9, -" in message


@pytest.mark.parametrize("name", ["a", "chat", "chat-2", "a" * 31, "x0-y"])
def test_good_names_pass(name):
    [result] = plan([{"name": name}])
    assert result["name"] == name
    assert result["container_name"] == f"vllm-{name}"


def test_unknown_item_keys_are_refused_and_listed():
    with pytest.raises(PlanError) as exc:
        plan([{"name": "chat", "tp": 2, "gpus": [0, 1], "model": "m"}])
    message = str(exc.value)
    assert message.startswith("deployment chat: unknown key(s) gpus, tp; known: ")
    known = message.split("known: ", 1)[1].split(", ")
    assert known == sorted(ALL_KEYS)


def test_mutable_defaults_are_not_shared_across_calls():
    first = plan([{"name": "chat"}])
    first[0]["extra_args"].append("--x")
    first[0]["env"]["A"] = "1"
    first[0]["served_model_aliases"].append("gpt")
    second = plan([{"name": "chat"}])
    assert second[0]["extra_args"] == []
    assert second[0]["env"] == {}
    assert second[0]["served_model_aliases"] == []
    assert deployments.OWN_DEFAULTS["extra_args"] == []
    assert deployments.OWN_DEFAULTS["env"] == {}
    assert deployments.OWN_DEFAULTS["served_model_aliases"] == []


@pytest.mark.parametrize("key, mutate", [
    ("served_model_aliases", lambda v: v.append("gpt")),
    ("extra_args", lambda v: v.append("--enforce-eager")),
    ("env", lambda v: v.update(A="1")),
])
def test_mutable_defaults_are_not_shared_between_deployments(key, mutate):
    chat, embed = plan([{"name": "chat"}, {"name": "embed"}])
    mutate(chat[key])
    assert embed[key] == copy.deepcopy(deployments.OWN_DEFAULTS[key])


def test_normalize_does_not_change_its_inputs():
    items = [{"name": "chat", "port": "8001"}]
    overrides = {"chat": {"max_num_seqs": 4}}
    fleet = dict(FLEET)
    before = copy.deepcopy((items, overrides, fleet))
    normalize(items, fleet, overrides)
    assert (items, overrides, fleet) == before


# --- served_names, gpu_count, on_host --------------------------------------------------------------------------------

def test_served_names_puts_the_served_name_first_then_aliases_without_repeats():
    d = {"served_model_name": "qwen", "served_model_aliases": ["gpt-4", "qwen", "chat"]}
    assert served_names(d) == ["qwen", "gpt-4", "chat"]


@pytest.mark.parametrize("aliases", [None, []])
def test_served_names_without_aliases(aliases):
    assert served_names({"served_model_name": "qwen", "served_model_aliases": aliases}) == ["qwen"]
    assert served_names({"served_model_name": "qwen"}) == ["qwen"]


@pytest.mark.parametrize("tp, pp, expected", [(1, 1, 1), (2, 1, 2), (2, 2, 4), (4, 2, 8), ("2", "3", 6),
                                              (None, None, 1), (None, 2, 2)])
def test_gpu_count_is_tp_times_pp(tp, pp, expected):
    assert gpu_count({"tensor_parallel_size": tp, "pipeline_parallel_size": pp}) == expected


def test_gpu_count_is_zero_when_sharing():
    assert gpu_count({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "shares_gpu_with": "chat"}) == 0
    assert gpu_count({"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "shares_gpu_with": ""}) == 2


def test_on_host_selects_by_group():
    result = three_deployments()
    assert [d["name"] for d in on_host(result, ["all", "vllm_servers"])] == ["chat", "embed"]
    assert [d["name"] for d in on_host(result, ["router_servers"])] == ["router"]
    assert [d["name"] for d in on_host(result, ("vllm_servers", "router_servers"))] == ["chat", "embed", "router"]
    assert on_host(result, ["other"]) == []
    assert on_host(result, []) == []
    assert on_host(result, None) == []


# --- fleet_errors --------------------------------------------------------------------------------------------------

def test_valid_three_deployment_plan_has_no_fleet_errors():
    result = three_deployments()
    assert fleet_errors(result) == []
    assert placement_errors(result, "gpu1", ["vllm_servers"], 2, False) == []
    assert placement_errors(result, "rt1", ["router_servers"], 1, False) == []


def test_single_plan_has_no_fleet_errors():
    assert fleet_errors(normalize(None, dict(FLEET), served_model_name="qwen")) == []


def test_duplicate_names():
    a = deployment("chat", container_name="vllm-a", served_model_name="a", port=8000)
    b = deployment("chat", container_name="vllm-b", served_model_name="b", port=8001)
    assert fleet_errors([a, b]) == [
        "deployment name chat is used twice in onprem_vllm_deployments: names must be unique"]


def test_duplicate_container_names():
    a = deployment("chat", container_name="vllm-x")
    b = deployment("embed", container_name="vllm-x")
    assert fleet_errors([a, b]) == [
        "deployments chat and embed both use container_name vllm-x: give each its own"]


def test_two_deployments_with_the_same_served_name():
    a = deployment("chat", served_model_name="qwen")
    b = deployment("embed", served_model_name="qwen")
    [error] = fleet_errors([a, b])
    assert error.startswith("deployments chat and embed both answer to the model name qwen:")
    assert "served_model_name or served_model_aliases" in error


def test_alias_answering_another_deployments_served_name():
    a = deployment("chat", served_model_name="qwen")
    b = deployment("embed", served_model_aliases=["bge", "qwen"])
    [error] = fleet_errors([a, b])
    assert error.startswith("deployments chat and embed both answer to the model name qwen:")


def test_two_deployments_with_the_same_alias():
    a = deployment("chat", served_model_aliases=["gpt-4"])
    b = deployment("embed", served_model_aliases=["gpt-4"])
    [error] = fleet_errors([a, b])
    assert error.startswith("deployments chat and embed both answer to the model name gpt-4:")


def test_a_deployment_may_repeat_its_own_served_name_as_alias():
    assert fleet_errors([deployment("chat", served_model_aliases=["chat", "gpt"])]) == []


@pytest.mark.parametrize("served", ["qwen 3", "qwen\"3", "", "-qwen", None, "a" * 129])
def test_bad_served_name(served):
    [error] = fleet_errors([deployment("chat", served_model_name=served)])
    assert error.startswith(f"deployment chat: served name {served!r} must be one word")


def test_bad_alias():
    [error] = fleet_errors([deployment("chat", served_model_aliases=["my model"])])
    assert error.startswith("deployment chat: served name 'my model' must be one word")


@pytest.mark.parametrize("served", ["Qwen/Qwen3-30B-A3B-FP8", "qwen3:30b", "gpt-4o_mini.v2", "a" * 128])
def test_good_served_names(served):
    assert fleet_errors([deployment("chat", served_model_name=served)]) == []


def test_aliases_must_be_a_list():
    [error] = fleet_errors([deployment("chat", served_model_aliases="gpt")])
    assert error == "deployment chat: served_model_aliases must be a list of names"


@pytest.mark.parametrize("runner", ["embed", "", None, "Generate"])
def test_bad_runner(runner):
    [error] = fleet_errors([deployment("chat", runner=runner)])
    assert error.startswith(f"deployment chat: runner must be one of generate, pooling (pooling serves embeddings "
                            f"and rerank), got {runner!r}")


def test_extra_args_and_env_types():
    errors = fleet_errors([deployment("chat", extra_args="--enforce-eager", env=["A=1"])])
    assert errors == ["deployment chat: extra_args must be a list of arguments",
                      "deployment chat: env must be a mapping of variable to value"]


@pytest.mark.parametrize("limits", [{"image": -1}, {"image": "two"}, ["image"]])
def test_limit_mm_per_prompt_counts(limits):
    [error] = fleet_errors([deployment("chat", limit_mm_per_prompt=limits)])
    assert error.startswith("deployment chat: limit_mm_per_prompt must map modalities to counts of 0 or more")
    assert fleet_errors([deployment("chat", limit_mm_per_prompt={"image": 0, "video": "0"})]) == []


def _sharing(**embed_changes):
    chat = deployment("chat", tensor_parallel_size=2, gpu_memory_utilization=0.82)
    settings = {"shares_gpu_with": "chat", "tensor_parallel_size": 1, "gpu_memory_utilization": 0.08,
                "kv_cache_memory": "auto", "port": 8001}
    embed = deployment("embed", **dict(settings, **embed_changes))
    return chat, embed


def test_shares_gpu_with_an_unknown_deployment():
    chat, embed = _sharing(shares_gpu_with="chatt")
    assert fleet_errors([chat, embed]) == [
        "deployment embed: shares_gpu_with names chatt, which is not a deployment of the plan"]


def test_shares_gpu_with_a_deployment_that_itself_shares():
    chat, embed = _sharing()
    rerank = deployment("rerank", shares_gpu_with="embed", tensor_parallel_size=1, kv_cache_memory="auto")
    [error] = fleet_errors([chat, embed, rerank])
    assert error.startswith("deployment rerank: shares_gpu_with names embed, which itself shares a GPU")
    assert "name the deployment that owns the GPU" in error


def test_shares_gpu_with_a_deployment_on_other_hosts():
    chat, embed = _sharing(hosts="embed_servers")
    assert fleet_errors([chat, embed]) == []
    # A host of embed's group that also runs chat is fine; one that does not is refused, naming both groups.
    assert placement_errors([chat, embed], "ws1", ["vllm_servers", "embed_servers"], 2, False) == []
    assert placement_errors([chat, embed], "ws9", ["embed_servers"], 2, False) == [
        "deployment embed shares a GPU of chat, which does not run on ws9: its hosts group (embed_servers) must hold "
        "only hosts of chat's (vllm_servers)"]


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_shared_deployment_must_take_one_gpu(tp, pp):
    chat, embed = _sharing(tensor_parallel_size=tp, pipeline_parallel_size=pp)
    assert fleet_errors([chat, embed]) == [
        "deployment embed shares one GPU of chat: set tensor_parallel_size and pipeline_parallel_size to 1"]


@pytest.mark.parametrize("kv", ["", "  ", None])
def test_shared_deployment_must_pin_its_kv_cache(kv):
    chat, embed = _sharing(kv_cache_memory=kv)
    [error] = fleet_errors([chat, embed])
    assert error.startswith("deployment embed shares a GPU: pin its KV pool (kv_cache_memory: auto")


def test_shared_deployment_with_pinned_kv_bytes_passes():
    chat, embed = _sharing(kv_cache_memory=2 * 1024 ** 3)
    assert fleet_errors([chat, embed]) == []


# --- placement_errors ----------------------------------------------------------------------------------------------

def test_host_in_no_deployments_group():
    result = three_deployments()
    assert placement_errors(result, "gpu9", ["all", "monitoring"], 2, False) == [
        "gpu9 is in no deployment's hosts group (router_servers, vllm_servers): add it to one, or take it out of "
        "vllm_servers"]


def test_duplicate_ports_on_a_host():
    a = deployment("chat", port=8000, tensor_parallel_size=1)
    b = deployment("embed", port=8000, tensor_parallel_size=1)
    assert placement_errors([a, b], "gpu1", ["vllm_servers"], 2, False) == [
        "deployments chat and embed both listen on port 8000 of gpu1: give each its own port in "
        "onprem_vllm_deployments"]


def test_same_port_on_different_hosts_is_fine():
    a = deployment("chat", port=8000, tensor_parallel_size=1)
    b = deployment("router", port=8000, tensor_parallel_size=1, hosts="router_servers")
    assert placement_errors([a, b], "gpu1", ["vllm_servers"], 1, False) == []
    assert placement_errors([a, b], "rt1", ["router_servers"], 1, False) == []


@pytest.mark.parametrize("port", [0, -1, 65536, "http", None, 80.5])
def test_port_out_of_range(port):
    chat = deployment("chat", tensor_parallel_size=1)
    chat["port"] = port
    assert placement_errors([chat], "gpu1", ["vllm_servers"], 1, False) == [
        f"deployment chat: port must be a TCP port number, got {port!r}"]


@pytest.mark.parametrize("port", [1, 65535])
def test_port_limits_pass(port):
    assert placement_errors([deployment("chat", port=port, tensor_parallel_size=1)], "gpu1", ["vllm_servers"],
                            1, False) == []


def test_cpu_mode_skips_gpu_accounting():
    chat = deployment("chat", tensor_parallel_size=4, port=8000)
    router = deployment("router", tensor_parallel_size=2, port=8001)
    embed = deployment("embed", shares_gpu_with="chat", shared_gpu_index=7, gpu_memory_utilization=0.9,
                       tensor_parallel_size=1, kv_cache_memory="auto", port=8002)
    assert placement_errors([chat, router, embed], "cpu1", ["vllm_servers"], 1, True) == []


def test_cpu_mode_still_checks_ports():
    chat = deployment("chat", port=8000)
    router = deployment("router", port=8000)
    [error] = placement_errors([chat, router], "cpu1", ["vllm_servers"], 0, True)
    assert error.startswith("deployments chat and router both listen on port 8000 of cpu1")


def test_too_many_whole_gpus():
    chat = deployment("chat", tensor_parallel_size=2, port=8000)
    router = deployment("router", tensor_parallel_size=1, port=8001)
    [error] = placement_errors([chat, router], "gpu1", ["vllm_servers"], 2, False)
    assert error.startswith("gpu1 has 2 GPU(s) but its deployments take 3 whole GPUs (chat: 2, router: 1): ")
    assert "lower a tensor_parallel_size, share a GPU (shares_gpu_with) or move a deployment to other hosts" in error


def test_whole_gpus_that_fit():
    chat = deployment("chat", tensor_parallel_size=2, port=8000)
    router = deployment("router", tensor_parallel_size=1, port=8001)
    assert placement_errors([chat, router], "gpu1", ["vllm_servers"], 3, False) == []


def test_unknown_gpu_count_skips_the_whole_gpu_check():
    chat = deployment("chat", tensor_parallel_size=8, port=8000)
    assert placement_errors([chat], "gpu1", ["vllm_servers"], 0, False) == []


def test_shared_deployments_take_no_whole_gpu():
    chat, embed = _sharing()
    assert placement_errors([chat, embed], "gpu1", ["vllm_servers"], 2, False) == []


@pytest.mark.parametrize("index", [2, 5, -1])
def test_shared_gpu_index_outside_the_owners_gpus(index):
    chat, embed = _sharing(shared_gpu_index=index)
    assert placement_errors([chat, embed], "gpu1", ["vllm_servers"], 2, False) == [
        f"deployment embed: shared_gpu_index {index} is not one of chat's 2 GPU(s) (0 to 1)"]


@pytest.mark.parametrize("index", [0, 1, "1"])
def test_shared_gpu_index_inside_the_owners_gpus(index):
    chat, embed = _sharing(shared_gpu_index=index)
    assert placement_errors([chat, embed], "gpu1", ["vllm_servers"], 2, False) == []


def test_shared_gpu_utilization_above_the_limit():
    chat, embed = _sharing()
    rerank = deployment("rerank", shares_gpu_with="chat", tensor_parallel_size=1, gpu_memory_utilization=0.08,
                        kv_cache_memory="auto", port=8002)
    [error] = placement_errors([chat, embed, rerank], "gpu1", ["vllm_servers"], 2, False)
    assert error.startswith("GPU 0 of chat on gpu1 is shared by chat (0.82), embed (0.08), rerank (0.08): their "
                            f"gpu_memory_utilization sums to 0.98, above {SHARED_GPU_UTILIZATION_LIMIT} ")
    assert "lower them so the sum fits" in error


def test_shared_gpu_utilization_is_counted_per_gpu():
    chat, embed = _sharing(shared_gpu_index=0)
    rerank = deployment("rerank", shares_gpu_with="chat", shared_gpu_index=1, tensor_parallel_size=1,
                        gpu_memory_utilization=0.08, kv_cache_memory="auto", port=8002)
    assert placement_errors([chat, embed, rerank], "gpu1", ["vllm_servers"], 2, False) == []


def test_shared_gpu_utilization_below_the_limit():
    chat, embed = _sharing()
    assert placement_errors([chat, embed], "gpu1", ["vllm_servers"], 2, False) == []


@pytest.mark.parametrize("owner, sharers", [(0.87, [0.08]), (0.85, [0.1]), (0.8, [0.08, 0.07]), (0.75, [0.1, 0.1])])
def test_shared_gpu_utilization_exactly_at_the_limit_passes(owner, sharers):
    assert SHARED_GPU_UTILIZATION_LIMIT == 0.95
    chat = deployment("chat", tensor_parallel_size=2, gpu_memory_utilization=owner)
    shared = [deployment(f"s{i}", shares_gpu_with="chat", tensor_parallel_size=1, gpu_memory_utilization=value,
                         kv_cache_memory="auto", port=8001 + i) for i, value in enumerate(sharers)]
    assert placement_errors([chat] + shared, "gpu1", ["vllm_servers"], 2, False) == []


def test_shared_gpu_utilization_just_above_the_limit_fails():
    chat = deployment("chat", tensor_parallel_size=2, gpu_memory_utilization=0.88)
    embed = deployment("embed", shares_gpu_with="chat", tensor_parallel_size=1, gpu_memory_utilization="0.08",
                       kv_cache_memory="auto", port=8001)
    [error] = placement_errors([chat, embed], "gpu1", ["vllm_servers"], 2, False)
    assert "sums to 0.96, above 0.95" in error
    assert "chat (0.88), embed (0.08)" in error


def test_placement_errors_only_look_at_this_hosts_deployments():
    result = three_deployments()
    result[2]["port"] = 8000  # router: same port as chat, but on other hosts
    result[2]["tensor_parallel_size"] = 4
    assert placement_errors(result, "gpu1", ["vllm_servers"], 2, False) == []
    [error] = placement_errors(result, "rt1", ["router_servers"], 2, False)
    assert error.startswith("rt1 has 2 GPU(s) but its deployments take 4 whole GPUs (router: 4)")


def test_each_deployment_s_canary_is_the_first_rollout_host_in_its_group():
    from ansible_collections.onprem.vllm.plugins.filter.rollout import deployment_canaries
    plan = [{"name": "chat", "hosts": "vllm_servers"}, {"name": "router", "hosts": "vllm_rag"},
            {"name": "embed", "hosts": "vllm_rag"}, {"name": "vision", "hosts": "vision_hosts"}]
    groups = {"vllm_servers": ["ws1", "ws2", "ws3"], "vllm_rag": ["ws3", "ws2"], "vision_hosts": ["ws9"]}
    # Play order decides, not the group's order; a deployment on no rollout host has no canary.
    assert deployment_canaries(plan, ["ws1", "ws2", "ws3"], groups) == {"chat": "ws1", "router": "ws2", "embed": "ws2"}
    # Limited to one host (-l ws3): it is every deployment's canary there.
    assert deployments.canaries(plan, ["ws3"], groups) == {"chat": "ws3", "router": "ws3", "embed": "ws3"}
    assert deployments.canaries(plan, [], groups) == {}


def test_a_host_checks_and_stages_each_image_once_through_its_first_deployment():
    from ansible_collections.onprem.vllm.plugins.filter.deployments_per_image import deployments_per_image
    image = {"image": "vllm/vllm-openai", "image_tag": "v0.33.0", "image_digest": ""}
    plan = [dict(image, name="chat"), dict(image, name="router"), dict(image, name="embed", image_tag="v0.32.0"),
            dict(image, name="vision", image_digest="sha256:" + "a" * 64), dict(image, name="rerank")]
    assert [d["name"] for d in deployments_per_image(plan)] == ["chat", "embed", "vision"]
    # A deployment rollback.yml restores counts with the image it restores.
    restores = {"router": {"image": "vllm/vllm-openai", "image_tag": "v0.31.0", "image_digest": ""},
                "embed": dict(image)}
    assert [d["name"] for d in deployments.first_per_image(plan, restores)] == ["chat", "router", "vision"]
    assert deployments.first_per_image([]) == []
