# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The batches a `serial` play makes of its hosts, by Ansible's own rule, so a rollout knows which hosts are its canary.

Ansible (PlayIterator's batching in ansible.executor.playbook_executor): `serial` is a count, a percentage "N%" or a
list of them whose last entry repeats; a percentage of the play's hosts is int(N / 100 * hosts), at least one; a batch
size of 0 or less, or no serial at all, is every remaining host.
"""
from __future__ import annotations


class SerialError(ValueError):
    """A `serial` entry that is neither a whole number nor a whole-number percentage."""


def batch_size(entry, num_hosts: int) -> int:
    """One `serial` entry as a host count (0 or less: all hosts)."""
    text = str(entry).strip()
    try:
        if text.endswith("%"):
            return int(int(text[:-1]) / 100.0 * num_hosts) or 1
        return int(text)
    except ValueError:
        raise SerialError(f"serial entry {entry!r} is not a host count or a whole-number percentage like '25%'") from None


def serial_batches(serial, hosts: list) -> list[list]:
    """The hosts of each batch, in play order."""
    entries = serial if isinstance(serial, (list, tuple)) else [serial]
    entries = [entry for entry in entries if entry is not None] or [0]
    remaining = list(hosts)
    batches: list[list] = []
    index = 0
    while remaining:
        size = batch_size(entries[index], len(hosts))
        if size <= 0:
            batches.append(remaining)
            break
        batches.append(remaining[:size])
        remaining = remaining[size:]
        index = min(index + 1, len(entries) - 1)
    return batches
