"""Writing a small PDF by hand: numbered objects, their cross-reference table, the trailer."""

from __future__ import annotations

from collections.abc import Sequence

LINE_GAP = 14
"""Points between text_pdf's lines: the first line's baseline is at 760."""


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


def _escaped(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def text_pdf(
    pages: Sequence[Sequence[str]],
    outline: Sequence[tuple[str | bytes, int] | tuple[str | bytes, int, int]] = (),
    info: bytes = b"",
) -> bytes:
    """A PDF of `pages` (Helvetica, 11 pt, LINE_GAP points a line from 760 down, one text line
    an entry) with top-level bookmarks (title, 0-based page index[, the /XYZ destination's
    top: the page top, 792, when left out]); a bytes title is written as is (a hex string),
    and `info` is the /Info dictionary."""
    objects = [b"", b"", b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for lines in pages:
        page, content = len(objects) + 1, len(objects) + 2
        kids.append(page)
        ops = b"\n".join(
            [
                b"BT /F1 11 Tf %d TL 72 760 Td" % LINE_GAP,
                *(b"(%b) Tj T*" % _escaped(x) for x in lines),
                b"ET",
            ]
        )
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % content
        )
        objects.append(b"<< /Length %d >>\nstream\n%b\nendstream" % (len(ops), ops))
    catalog = b"<< /Type /Catalog /Pages 2 0 R"
    if outline:
        root = len(objects) + 1
        first = root + 1
        objects.append(
            b"<< /Type /Outlines /First %d 0 R /Last %d 0 R /Count %d >>"
            % (first, first + len(outline) - 1, len(outline))
        )
        for i, (title, page_index, *rest) in enumerate(outline):
            top = rest[0] if rest else 792
            written = title if isinstance(title, bytes) else b"(%b)" % _escaped(title)
            prev = b" /Prev %d 0 R" % (first + i - 1) if i else b""
            after = b" /Next %d 0 R" % (first + i + 1) if i < len(outline) - 1 else b""
            objects.append(
                b"<< /Title %b /Parent %d 0 R /Dest [%d 0 R /XYZ 0 %d 0]%b%b >>"
                % (written, root, kids[page_index], top, prev, after)
            )
        catalog += b" /Outlines %d 0 R" % root
    objects[0] = catalog + b" >>"
    objects[1] = b"<< /Type /Pages /Kids [%b] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    trailer = b""
    if info:
        objects.append(info)
        trailer = b"/Info %d 0 R" % len(objects)
    return assemble_pdf(objects, trailer)
