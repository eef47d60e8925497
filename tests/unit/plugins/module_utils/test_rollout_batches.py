from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleFilterError
from ansible.executor.playbook_executor import PlaybookExecutor

from ansible_collections.onprem.vllm.plugins.filter.rollout import serial_batches as serial_batches_filter
from ansible_collections.onprem.vllm.plugins.module_utils.rollout_batches import SerialError, serial_batches


def ansible_batches(serial, hosts):
    """Ansible's own batching (PlaybookExecutor._get_serialized_batches) on a stand-in inventory and play."""
    executor = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda pattern, order=None: list(hosts)))
    play = SimpleNamespace(hosts="all", order=None, serial=serial if isinstance(serial, list) else [serial])
    return PlaybookExecutor._get_serialized_batches(executor, play)


@pytest.mark.parametrize("serial", [
    [1, "25%"], [1, "50%"], ["25%"], ["33%"], ["10%"], ["100%"], [2], [1, 2, 5], [0], [], ["1%"], [3, "25%", 1], 1, "40%",
])
@pytest.mark.parametrize("num_hosts", [1, 2, 3, 4, 7, 10, 16])
def test_batches_are_ansibles(serial, num_hosts):
    hosts = [f"ws{i}" for i in range(1, num_hosts + 1)]
    assert serial_batches(serial, hosts) == ansible_batches(serial, hosts)


def test_the_default_ramp_on_the_lab_fleet():
    # The fleet scenario: three hosts, [1, '25%'] -> the canary alone, then int(0.75) -> at least one host per batch.
    assert serial_batches([1, "25%"], ["ws1", "ws2", "ws3"]) == [["ws1"], ["ws2"], ["ws3"]]
    assert serial_batches(["50%"], [f"h{i}" for i in range(8)])[0] == ["h0", "h1", "h2", "h3"]


@pytest.mark.parametrize("entry", ["12.5%", "a quarter", "%"])
def test_an_entry_ansible_cannot_read_is_named(entry):
    with pytest.raises(SerialError, match="not a host count or a whole-number percentage"):
        serial_batches([1, entry], ["ws1", "ws2", "ws3"])
    with pytest.raises(AnsibleFilterError, match=repr(entry).replace(".", r"\.")):
        serial_batches_filter([1, entry], ["ws1", "ws2", "ws3"])
