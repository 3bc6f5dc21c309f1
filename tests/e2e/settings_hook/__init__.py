"""Test-only settings for a mesh's processes that the services do not read from the
environment (see sitecustomize.py here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

HOOK_DIR = Path(__file__).resolve().parent
REPO_ROOT = HOOK_DIR.parents[2]


def settings_overrides(**groups: dict[str, Any]) -> dict[str, str]:
    """Environment for `Mesh(env=...)`: each group's fields (runtime, cbr, tavily, index,
    engine) replaced in the processes of the service that reads them."""
    path = [str(HOOK_DIR), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "E2E_SETTINGS_OVERRIDES": json.dumps(groups),
    }
