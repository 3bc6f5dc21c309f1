"""gen/ and the Envoy files must be exactly what `make gen` produces from proto/ now."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from services.devtools.envoy import REPO_ROOT as ROOT


def check_gen(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "tools" / "check_gen.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_committed_generated_code_is_fresh():
    result = check_gen(ROOT)
    assert result.returncode == 0, result.stderr


def test_a_proto_change_without_regeneration_is_caught(tmp_path):
    for part in ("proto", "third_party", "tools", "gen", "envoy", "services"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    proto = tmp_path / "proto/visior/toolsproxy/v1/toolsproxy.proto"
    proto.write_text(
        proto.read_text().replace(
            "string trace_id = 4;", "string trace_id = 4;\n  // extra\n  string extra = 5;", 1
        )
    )
    result = check_gen(tmp_path)
    assert result.returncode == 1
    assert "stale" in result.stderr
