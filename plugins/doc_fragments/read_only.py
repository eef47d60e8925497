# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations


class ModuleDocFragment:
    """The attributes of the read-only (C(_info)) modules."""

    DOCUMENTATION = r"""
attributes:
  check_mode:
    description: Only reads; it runs the same in check mode.
    support: full
  diff_mode:
    description: Returns no diff; nothing changes.
    support: none
"""
