# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading `docker inspect` output: several objects in one CLI call, a missing one being an answer, not an error.

`docker inspect A B` prints a JSON list of the objects it found and, for each one it did not, "No such ..." on
stderr with exit status 1. Anything else on stderr (the daemon not running, no permission) is a real error.
"""
from __future__ import annotations

import json


class InspectError(Exception):
    pass


def _missing_only(stderr):
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return all("No such" in line or "no such" in line for line in lines)


def found_objects(rc, stdout, stderr):
    """The list of objects one `docker inspect` printed; raises InspectError when it failed for another reason than
    an object not existing."""
    text = stdout.strip()
    if rc != 0 and not _missing_only(stderr):
        raise InspectError("docker inspect failed (exit %s): %s" % (rc, stderr.strip() or text))
    if not text:
        return []
    try:
        objects = json.loads(text)
    except ValueError as exc:
        raise InspectError("docker inspect printed no JSON list: %s" % exc)
    if not isinstance(objects, list):
        raise InspectError("docker inspect printed %s, not a list" % type(objects).__name__)
    return objects


def containers_by_name(objects, names):
    """{name: {'exists': bool, 'container': the inspect object or None}} for each name, as docker_container_info
    answers (Docker stores the name with a leading slash)."""
    by_name = {obj.get("Name", "").lstrip("/"): obj for obj in objects if isinstance(obj, dict)}
    return {name: {"exists": name in by_name, "container": by_name.get(name)} for name in names}
