#!/usr/bin/env bash
# Fails (exit 1) when gen/, the Envoy files (deploy/envoy/ too), the OpenAPI description,
# docs/configuration.md or services/common/setting_names.py differ from what `make gen` produces.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$here/tools/gen.sh" "$tmp" >/dev/null 2>"$tmp/gen.log" || { cat "$tmp/gen.log" >&2; exit 2; }
status=0
diff -r -x __pycache__ "$here/gen/python" "$tmp/gen/python" >"$tmp/diff" || status=1
for f in envoy/visior.pb envoy/envoy.yaml openapi/visior.openapi.yaml docs/configuration.md \
    services/common/setting_names.py; do
  cmp -s "$here/$f" "$tmp/$f" || { echo "stale: $f" >>"$tmp/diff"; status=1; }
done
PYTHONPATH="$here/gen/python:$here" "${PYTHON:-$here/.venv/bin/python}" "$here/deploy/render_envoy.py" --check \
  2>>"$tmp/diff" || status=1
if [ "$status" -ne 0 ]; then
  echo "generated code is stale; run 'make gen' and commit:" >&2
  head -50 "$tmp/diff" >&2
fi
exit "$status"
