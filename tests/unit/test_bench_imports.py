"""Every benchmark and tool script imports: a name moved or renamed in `services/` breaks
them at their first run otherwise, since no other test runs them."""

from __future__ import annotations

import subprocess
import sys

from services.devtools.envoy import REPO_ROOT

SCRIPTS = sorted(
    p.relative_to(REPO_ROOT)
    for folder in ("bench", "tools")
    for p in (REPO_ROOT / folder).rglob("*.py")
    if "out" not in p.relative_to(REPO_ROOT).parts and not p.name.startswith(".")
)

# One process imports them all (each as the module its path names), with the folders the
# scripts put on sys.path themselves, and prints the ones that fail.
_IMPORT_ALL = """
import importlib, sys, traceback
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except BaseException:
        print(module, traceback.format_exc(limit=1).strip().splitlines()[-1])
"""


def test_every_benchmark_and_tool_script_imports() -> None:
    modules = [".".join(p.with_suffix("").parts) for p in SCRIPTS]
    assert "bench.search_engine" in modules and "tools.config_docs" in modules
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(REPO_ROOT), *modules],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", f"scripts that do not import:\n{done.stdout}"
