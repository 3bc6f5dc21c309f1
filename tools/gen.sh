#!/usr/bin/env bash
# Generates everything under gen/, the Envoy descriptor set and config, and the OpenAPI
# description (openapi/visior.openapi.yaml) from proto/, and docs/configuration.md from the
# settings' declarations (tools/config_docs.py).
# Reproducible: same protos + same pinned tool versions -> same bytes.
# Usage: tools/gen.sh [OUT_ROOT]   (OUT_ROOT defaults to the repo; check-gen
# passes a temp dir and diffs).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$here}"
py="${PYTHON:-$here/.venv/bin/python}"
bin="$(dirname "$py")"
cd "$here"
protos=$(find proto -name '*.proto' | LC_ALL=C sort)

rm -rf "$out/gen/python"
mkdir -p "$out/gen/python/visior_sdk" "$out/envoy"

# grpcio messages, type stubs and stubs (package `visior.*`).
"$py" -m grpc_tools.protoc -Iproto -Ithird_party \
  --python_out="$out/gen/python" --pyi_out="$out/gen/python" \
  --grpc_python_out="$out/gen/python" $protos
# Regular packages, so mypy and setuptools see them.
find "$out/gen/python/visior" -type d -exec touch {}/__init__.py \;

# betterproto dataclasses + grpclib async stubs for the typed client SDK.
PATH="$bin:$PATH" "$py" -m grpc_tools.protoc -Iproto -Ithird_party \
  --python_betterproto_out="$out/gen/python/visior_sdk" $protos 2>&1 | { grep -v '^Writing ' >&2 || true; }

# Descriptor set for Envoy's gRPC-JSON transcoder. error_details.proto is
# included so google.rpc.Status details (ErrorInfo) render as JSON.
"$py" -m grpc_tools.protoc -Iproto -Ithird_party --include_imports \
  --descriptor_set_out="$out/envoy/visior.pb" \
  $protos google/rpc/status.proto google/rpc/error_details.proto

# OpenAPI description of the JSON routes, from the same protos (with their comments).
PYTHONPATH="$out/gen/python:$here" "$py" "$here/tools/openapi.py" --out "$out/openapi/visior.openapi.yaml"

# The configuration page, from the settings' declarations and their docstrings.
mkdir -p "$out/docs" "$out/services/common"
PYTHONPATH="$out/gen/python:$here" "$py" "$here/tools/config_docs.py" --out "$out/docs/configuration.md" \
  --names-out "$out/services/common/setting_names.py"

# Envoy config for the default ports.
PYTHONPATH="$out/gen/python:$here" "$py" -m services.devtools.envoy_config > "$out/envoy/envoy.yaml"

# The deploy sidecars' configs and descriptor copy (deploy/envoy/), from the files above;
# rendered into the repo only (check-gen runs deploy/render_envoy.py --check instead).
if [ "$out" = "$here" ]; then
  PYTHONPATH="$here/gen/python:$here" "$py" "$here/deploy/render_envoy.py"
fi
