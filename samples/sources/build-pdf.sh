#!/bin/sh
# Rebuild samples/docs/orion-x-operations-manual.pdf from its HTML source with LibreOffice
# (Debian 12: apt-get install -y --no-install-recommends libreoffice-writer-nogui; 7.4.7).
# Writer turns <h1>/<h2> into Heading 1/2 and exports them as the PDF outline (bookmarks).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
soffice --headless --infilter="HTML (StarWriter)" --convert-to pdf:writer_pdf_Export \
  --outdir "$out" "$here/orion-x-operations-manual.html"
mv "$out/orion-x-operations-manual.pdf" "$here/../docs/"
rmdir "$out"
