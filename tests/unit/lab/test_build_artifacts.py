# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""lab/build_artifacts.py: the checkpoint and the image archives are made at once and each records its entry in the
share's manifest: no entry is lost and the file on disk is always whole JSON."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "lab"))
SPEC = importlib.util.spec_from_file_location("build_artifacts", os.path.join(ROOT, "lab", "build_artifacts.py"))
build_artifacts = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(build_artifacts)


def test_records_from_two_threads_all_land_in_the_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr(build_artifacts, "MANIFEST", tmp_path / "share" / "manifest.json")
    manifest = {"images": {}, "models": {}}

    def writer(section):
        for n in range(300):
            build_artifacts.record(manifest, section, f"{section}-{n}", {"n": n, "pad": "x" * 200})

    threads = [threading.Thread(target=writer, args=(section,)) for section in ("images", "models")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    on_disk = json.loads((tmp_path / "share" / "manifest.json").read_text())
    assert on_disk == manifest
    assert len(on_disk["images"]) == len(on_disk["models"]) == 300
