# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host_files module on real files: directories, exact contents and modes in one run, nothing changed on
the second run, check mode changes nothing, a secret never comes back in the result."""
from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.onprem.vllm.plugins.modules import host_files

SECRET = "sk-test-secret-value"


@pytest.fixture
def server_files(call_module):
    return lambda **args: call_module(host_files, **args)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _layout(root):
    config = root / "etc" / "onprem-vllm"
    return dict(
        directories=[dict(path=str(config), mode="0700"), dict(path=str(config / "middleware"), mode="0755")],
        files=[dict(path=str(config / "vllm.api-key"), content=SECRET + "\n", mode="0600"),
               dict(path=str(config / "middleware" / "auth.py"), content="print('auth')\n", mode="0644")],
        absent=[str(config / "vllm.env")],
    )


def test_creates_writes_and_removes_in_one_run_then_changes_nothing(server_files, tmp_path):
    config = tmp_path / "etc" / "onprem-vllm"
    config.mkdir(parents=True, mode=0o755)
    (config / "vllm.env").write_text("VLLM_API_KEY=old\n")
    rc, result = server_files(**_layout(tmp_path))
    assert rc == 0 and result["changed"] is True
    # The existing directory only changed mode; its parent etc/ existed.
    assert result["changed_paths"] == [str(config), str(config / "middleware"), str(config / "vllm.api-key"),
                                       str(config / "middleware" / "auth.py"), str(config / "vllm.env")]
    assert _mode(config) == 0o700 and _mode(config / "middleware") == 0o755
    assert (config / "vllm.api-key").read_text() == SECRET + "\n" and _mode(config / "vllm.api-key") == 0o600
    assert (config / "middleware" / "auth.py").read_text() == "print('auth')\n"
    assert _mode(config / "middleware" / "auth.py") == 0o644
    assert not (config / "vllm.env").exists()
    assert sorted(os.listdir(config)) == ["middleware", "vllm.api-key"]  # no temporary file left behind
    assert SECRET not in json.dumps(result)

    rc, again = server_files(**_layout(tmp_path))
    assert rc == 0 and again["changed"] is False and again["changed_paths"] == []


def test_a_changed_content_or_mode_is_reported_by_path(server_files, tmp_path):
    server_files(**_layout(tmp_path))
    config = tmp_path / "etc" / "onprem-vllm"
    (config / "middleware" / "auth.py").chmod(0o666)
    layout = _layout(tmp_path)
    layout["files"][0]["content"] = "sk-rotated\n"
    rc, result = server_files(**layout)
    assert rc == 0 and result["changed_paths"] == [str(config / "vllm.api-key"), str(config / "middleware" / "auth.py")]
    assert (config / "vllm.api-key").read_text() == "sk-rotated\n" and _mode(config / "vllm.api-key") == 0o600
    assert _mode(config / "middleware" / "auth.py") == 0o644


def test_missing_parents_are_created_with_the_directory(server_files, tmp_path):
    cache = tmp_path / "data" / "vllm" / "cache"
    rc, result = server_files(directories=[dict(path=str(cache), mode="0750")])
    assert rc == 0 and result["changed_paths"] == [str(cache)]
    assert _mode(tmp_path / "data") == 0o750 and _mode(cache) == 0o750


def test_check_mode_reports_and_changes_nothing(server_files, tmp_path):
    (tmp_path / "old.env").write_text("x")
    layout = _layout(tmp_path)
    layout["absent"] = [str(tmp_path / "old.env")]
    rc, result = server_files(_ansible_check_mode=True, **layout)
    assert rc == 0 and result["changed"] is True and len(result["changed_paths"]) == 5
    assert sorted(os.listdir(tmp_path)) == ["old.env"]


@pytest.mark.parametrize("args, message", [
    (dict(files=[dict(path="relative/key", content="x", mode="0600")]), "relative/key is not an absolute path"),
    (dict(directories=[dict(path="/tmp/x", mode="rw")]), "mode 'rw' of /tmp/x is not an octal mode"),
    (dict(absent=["old/vllm.env"]), "old/vllm.env is not an absolute path"),
])
def test_bad_arguments_fail_before_anything_changes(server_files, args, message):
    rc, result = server_files(**args)
    assert rc == 1 and message in result["msg"]


def test_a_file_whose_directory_is_missing_fails_naming_it(server_files, tmp_path):
    rc, result = server_files(files=[dict(path=str(tmp_path / "nowhere" / "key"), content=SECRET, mode="0600")])
    assert rc == 1 and "its directory %s does not exist" % (tmp_path / "nowhere") in result["msg"]
    assert SECRET not in json.dumps(result)


def test_the_fingerprint_follows_the_files_under_a_host_salt_and_reveals_nothing(server_files, tmp_path):
    """A container label carries the fingerprint: the same files give the same one on every run, a changed key another,
    and without the host's salt (0600, made on first use) nobody can test a guessed key against it."""
    layout = dict(_layout(tmp_path), fingerprint_salt_file=str(tmp_path / "etc" / "onprem-vllm" / "files.salt"))
    salt = tmp_path / "etc" / "onprem-vllm" / "files.salt"
    rc, first = server_files(**layout)
    assert rc == 0 and salt.exists() and _mode(salt) == 0o600 and str(salt) in first["changed_paths"]
    assert len(first["fingerprint"]) == 64 and SECRET not in json.dumps(first)
    rc, again = server_files(**layout)
    assert again["fingerprint"] == first["fingerprint"] and again["changed"] is False

    rotated = dict(layout, files=[dict(layout["files"][0], content="sk-rotated\n"), layout["files"][1]])
    rc, after = server_files(**rotated, _ansible_check_mode=True)
    assert after["fingerprint"] != first["fingerprint"]  # check mode plans the redeploy too
    assert (tmp_path / "etc" / "onprem-vllm" / "vllm.api-key").read_text() == SECRET + "\n"

    salt.write_text("another-host-salt\n")
    rc, elsewhere = server_files(**layout)
    assert elsewhere["fingerprint"] not in (first["fingerprint"], after["fingerprint"])


def test_a_file_left_out_of_the_fingerprint_changes_it_not(server_files, tmp_path):
    """vllm_server's key file: the middleware reads it again itself, so a rotation must not redeploy the container;
    the middleware's code is read at startup and still counts."""
    layout = dict(_layout(tmp_path), fingerprint_salt_file=str(tmp_path / "files.salt"))
    layout["files"][0]["fingerprint"] = False
    rc, first = server_files(**layout)
    rotated = dict(layout, files=[dict(layout["files"][0], content="sk-rotated\n"), layout["files"][1]])
    rc, after = server_files(**rotated)
    assert after["changed"] and after["fingerprint"] == first["fingerprint"]
    recoded = dict(layout, files=[layout["files"][0], dict(layout["files"][1], content="print('v2')\n")])
    rc, again = server_files(**recoded)
    assert again["fingerprint"] != first["fingerprint"]


def test_in_check_mode_without_a_salt_no_fingerprint_is_made_and_nothing_written(server_files, tmp_path):
    layout = dict(_layout(tmp_path), fingerprint_salt_file=str(tmp_path / "files.salt"))
    rc, result = server_files(**layout, _ansible_check_mode=True)
    assert rc == 0 and result["fingerprint"] == "" and not (tmp_path / "files.salt").exists()


def test_a_file_is_validated_before_it_replaces_the_old_one(server_files, tmp_path):
    config = tmp_path / "rules.yml"
    config.write_text("old: true\n")
    item = dict(path=str(config), content="groups: []\n", mode="0644", validate="grep -q groups %s")
    rc, result = server_files(files=[item])
    assert rc == 0 and result["changed_paths"] == [str(config)] and config.read_text() == "groups: []\n"

    rc, result = server_files(files=[dict(item, content="broken\n")])
    assert rc == 1 and "failed 'grep -q groups %s'" in result["msg"] and str(config) in result["msg"]
    assert config.read_text() == "groups: []\n"  # the old file stays
    assert os.listdir(tmp_path) == ["rules.yml"]  # and no candidate is left behind

    # Unchanged content is not validated again (a check that needs the running service is not run for nothing).
    rc, result = server_files(files=[dict(item, validate="false %s")])
    assert rc == 0 and result["changed"] is False


def test_a_validate_command_without_the_path_is_refused(server_files, tmp_path):
    rc, result = server_files(files=[dict(path=str(tmp_path / "a"), content="x", mode="0644", validate="true")])
    assert rc == 1 and "must contain %s" in result["msg"] and not (tmp_path / "a").exists()


def test_a_create_only_file_keeps_the_content_another_program_wrote(server_files, tmp_path):
    acl = tmp_path / "over-budget.lst"
    item = dict(path=str(acl), content="", mode="0644", create_only=True)
    rc, result = server_files(files=[item])
    assert rc == 0 and result["changed_paths"] == [str(acl)] and acl.read_text() == ""
    acl.write_text("batch-jobs/qwen3\n")
    acl.chmod(0o600)
    rc, result = server_files(files=[item])
    assert rc == 0 and result["changed_paths"] == [str(acl)]  # the mode only
    assert acl.read_text() == "batch-jobs/qwen3\n" and _mode(acl) == 0o644


def test_an_item_group_wins_over_the_module_group(server_files, tmp_path):
    gid = os.getgid()
    target = tmp_path / "conf"
    rc, result = server_files(directories=[dict(path=str(tmp_path / "d"), mode="0750", group=str(gid))],
                              files=[dict(path=str(target), content="x\n", mode="0640", group=str(gid))],
                              group="no-such-group-onprem")
    assert rc == 0, result
    assert os.stat(target).st_gid == gid and os.stat(tmp_path / "d").st_gid == gid


def test_a_secret_file_that_fails_its_check_does_not_return_the_check_output(server_files, tmp_path):
    item = dict(path=str(tmp_path / "alertmanager.yml"), content="url: https://hooks.example/" + SECRET + "\n",
                mode="0640", validate="cat %s /nonexistent", secret=True)
    rc, result = server_files(files=[item])
    assert rc == 1 and "the file holds a secret" in result["msg"] and "hooks.example" not in json.dumps(result)
    rc, result = server_files(files=[dict(item, secret=False)])
    assert rc == 1 and "/nonexistent" in result["msg"]
