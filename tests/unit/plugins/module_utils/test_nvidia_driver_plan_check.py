# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""nouveau loaded on a host that needs an install and may not reboot: refused by the plan check."""
from __future__ import annotations

from ansible_collections.onprem.vllm.plugins.module_utils import nvidia_driver_plan as plan


def test_nouveau_with_no_reboot_allowed_is_refused():
    reboot = plan.reboot_decision(None, None, True, False, "ssh", False, "install")
    (msg,) = plan.plan_check_errors(True, "install", reboot)
    assert "nouveau is loaded and holds the GPUs" in msg
    assert "nvidia_driver_reboot is false" in msg
    assert "nvidia_driver_reboot: true" in msg


def test_nouveau_with_a_reboot_allowed_passes():
    reboot = plan.reboot_decision(None, None, True, True, "ssh", False, "install")
    assert plan.plan_check_errors(True, "install", reboot) == []


def test_nouveau_on_a_container_connection_is_refused():
    reboot = plan.reboot_decision(None, None, True, True, "community.docker.docker", False, "install")
    assert "never reboots through a container connection" in plan.plan_check_errors(True, "install", reboot)[0]


def test_no_nouveau_or_nothing_to_install_passes():
    reboot = plan.reboot_decision(None, None, False, False, "ssh", False, "install")
    assert plan.plan_check_errors(False, "install", reboot) == []
    assert plan.plan_check_errors(True, "skip", {"needed": False}) == []
