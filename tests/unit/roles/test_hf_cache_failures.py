# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""hf_cache's failure paths, each fault fed to the whole role (ansible-playbook, local connection) and its message
checked: a gated model without a token and a revision the hub does not have (conftest's hf_hub_double, a TEST DOUBLE
of the hub's API: no hub is reachable here), no room for the model, an archive that is not a tarball and a tarball
that does not hold the model; settings the role refuses (all of a case's at once). Each fails before anything lands
in the cache."""
from __future__ import annotations

import io
import json
import os
import tarfile

MODEL = "onprem-test/tiny"
COMMIT = "e" * 40
TOKEN = "hf_test_token_for_the_gated_model"
CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16"}
PLAYBOOK = """
- name: hf_cache under test
  hosts: all
  gather_facts: false
  tasks:
    - name: Stage the model
      ansible.builtin.include_role:
        name: hf_cache
"""


def _tarball(path, members):
    """A gzip tarball of {name: bytes}."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


# What each case's message must hold (all of it), besides nothing staged.
EXPECTED = {
    "gated_without_token": ["answered 401", "Vault-held hub token"],
    "revision_not_on_hub": ["answered 404", "no such model or revision"],
    "no_room": ["GiB free", "Nothing was downloaded or unpacked", "hf_cache_path"],
    "not_a_tarball": ["could not unpack", "must be a tarball"],
    "tarball_without_the_model": ["could not unpack", "models--onprem-test--tiny"],
    "bad_name_and_no_archive": ["set hf_cache_model to ORG/NAME (got not-a-repo-id)", "got 'main/../x'",
                                "hf_cache_source=archive needs hf_cache_archive"],
    "relative_archive_on_the_host": ["hf_cache_source=archive needs hf_cache_archive", "models--onprem-test--tiny"],
    "directory_not_absolute": ["hf_cache_source=directory needs hf_cache_directory"],
    "hub_without_image": ["hf_cache_source=hub needs hf_cache_image"],
    "symbolic_mode": ["hf_cache_mode must be an octal mode like 0755 (got 'u=rwx,go=rx')"],
}


def test_each_fault_stops_the_role_with_a_message_that_says_what_to_do(playbook_cases, hf_hub_double, tmp_path):
    """One play, a host per fault (they run side by side)."""
    files = {"config.json": CONFIG, "model.safetensors": 1_000_000}
    endpoint, _seen = hf_hub_double({MODEL: {"sha": COMMIT, "files": files}}, token=TOKEN)
    repo = "models--" + MODEL.replace("/", "--")
    model_tar = _tarball(tmp_path / "model.tar.gz", {
        f"{repo}/refs/main": COMMIT.encode(),
        f"{repo}/snapshots/{COMMIT}/config.json": json.dumps(CONFIG).encode()})
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"this is not a tarball\n" * 64)
    other_tar = _tarball(tmp_path / "other.tar.gz", {"models--someone--else/refs/main": COMMIT.encode()})
    hub = {"hf_cache_source": "hub", "hf_cache_hub_endpoint": endpoint, "hf_cache_image": "onprem-test/absent:1"}
    archive = {"hf_cache_source": "archive", "hf_cache_archive_remote_src": True, "hf_cache_revision": COMMIT}
    cases = {
        "gated_without_token": dict(hub, hf_cache_revision="main", hf_cache_token=""),
        "revision_not_on_hub": dict(hub, hf_cache_revision="f" * 40, hf_cache_token=TOKEN),
        "no_room": dict(archive, hf_cache_archive=model_tar, hf_cache_model_size_bytes=2 ** 60),
        "not_a_tarball": dict(archive, hf_cache_archive=str(junk)),
        "tarball_without_the_model": dict(archive, hf_cache_archive=other_tar),
        "bad_name_and_no_archive": dict(archive, hf_cache_archive="", hf_cache_model="not-a-repo-id",
                                        hf_cache_revision="main/../x"),
        "relative_archive_on_the_host": dict(archive, hf_cache_archive="models/tiny.tar"),
        "directory_not_absolute": {"hf_cache_source": "directory", "hf_cache_directory": "models",
                                   "hf_cache_revision": COMMIT},
        "hub_without_image": dict(hub, hf_cache_image="", hf_cache_revision=COMMIT),
        "symbolic_mode": dict(archive, hf_cache_archive=model_tar, hf_cache_mode="u=rwx,go=rx"),
    }
    for case, variables in cases.items():
        variables.setdefault("hf_cache_model", MODEL)
        variables["hf_cache_path"] = str(tmp_path / case / "hf")
    runs = playbook_cases(PLAYBOOK, cases, str(tmp_path))

    wrong = {}
    for case, needles in EXPECTED.items():
        message = runs[case].failure()
        staged = os.path.exists(tmp_path / case / "hf" / "hub" / repo / "snapshots" / COMMIT)
        if not message or staged or any(needle not in message for needle in needles):
            wrong[case] = {"message": message, "staged": staged, "needs": needles}
    assert not wrong, json.dumps(wrong, indent=1)
