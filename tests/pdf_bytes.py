"""Writing a small PDF by hand: numbered objects, their cross-reference table, the trailer."""

from __future__ import annotations

from collections.abc import Sequence


def assemble_pdf(objects: Sequence[bytes], trailer: bytes = b"") -> bytes:
    """A PDF 1.4 file of `objects` (object n is objects[n - 1]; object 1 is the catalog);
    `trailer` adds entries to the trailer dictionary (e.g. b"/Info 6 0 R")."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%b\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    extra = b" " + trailer if trailer else b""
    out += b"trailer\n<< /Size %d /Root 1 0 R%b >>\n" % (len(objects) + 1, extra)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)
