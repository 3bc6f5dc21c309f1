"""Rebuild bench/quality/corpus/ from Debian packages (apt-get download, dpkg-deb, groff)."""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
COMMON_LICENSES = Path("/usr/share/common-licenses")


@dataclass(frozen=True)
class Source:
    """One corpus file: where it comes from in which Debian package, and its licence."""

    out: str
    """File name in corpus/."""
    package: str
    """Debian binary package that ships the original."""
    path: str
    """Path of the original inside the package."""
    kind: str
    """How it is turned into the corpus file: pdf, pdf.gz, faq-txt, man."""
    licence: str
    """SPDX-style licence of the original (and of the translation, for translations)."""
    licence_files: tuple[str, ...]
    """Files in corpus/LICENSES/ that hold the licence text."""
    lang: str
    """Document language."""


RU_MAN = "/usr/share/man/ru"
EN_MAN = "/usr/share/man"
L10N = "manpages-l10n translation GPL-3.0-or-later"

SOURCES: tuple[Source, ...] = (
    Source(
        "debian-faq.en.pdf",
        "debian-faq",
        "/usr/share/doc/debian/FAQ/debian-faq.en.pdf.gz",
        "pdf.gz",
        "Debian FAQ licence (verbatim + modified copies, permissive)",
        ("debian-faq.copyright",),
        "en",
    ),
    Source(
        "maint-guide.ru.pdf",
        "maint-guide-ru",
        "/usr/share/doc/maint-guide-ru/maint-guide.ru.pdf",
        "pdf",
        "GPL-2.0-or-later",
        ("maint-guide-ru.copyright", "GPL-2"),
        "ru",
    ),
    Source(
        "debian-faq.ru.txt",
        "debian-faq-ru",
        "/usr/share/doc/debian/FAQ/debian-faq.ru.txt.gz",
        "faq-txt",
        "Debian FAQ licence (verbatim + modified copies, permissive)",
        ("debian-faq-ru.copyright",),
        "ru",
    ),
    # Russian man pages: man-pages 6.03 (per-page SPDX line, kept in SOURCES.md) translated by
    # manpages-l10n under GPL-3+; ls.1 is from GNU coreutils (GPL-3+).
    *(
        Source(
            f"{name}.{sec}.ru.md",
            "manpages-ru",
            f"{RU_MAN}/man{sec}/{name}.{sec}.gz",
            "man",
            "",
            ("manpages-ru.copyright", "GPL-3"),
            "ru",
        )
        for name, sec in (
            ("ls", 1),
            ("ldd", 1),
            ("iconv", 1),
            ("hosts", 5),
            ("resolv.conf", 5),
            ("nsswitch.conf", 5),
            ("tmpfs", 5),
            ("core", 5),
            ("hier", 7),
            ("random", 7),
        )
    ),
    Source(
        "sources.list.5.en.md",
        "apt",
        f"{EN_MAN}/man5/sources.list.5.gz",
        "man",
        "GPL-2.0-or-later",
        ("apt.copyright", "GPL-2"),
        "en",
    ),
    Source(
        "apt-get.8.en.md",
        "apt",
        f"{EN_MAN}/man8/apt-get.8.gz",
        "man",
        "GPL-2.0-or-later",
        ("apt.copyright", "GPL-2"),
        "en",
    ),
    Source(
        "ssh_config.5.en.md",
        "openssh-client",
        f"{EN_MAN}/man5/ssh_config.5.gz",
        "man",
        "BSD-2-Clause / OpenSSH licence",
        ("openssh-client.copyright",),
        "en",
    ),
    Source(
        "tar.1.en.md",
        "tar",
        f"{EN_MAN}/man1/tar.1.gz",
        "man",
        "GPL-3.0-or-later",
        ("tar.copyright", "GPL-3"),
        "en",
    ),
    Source(
        "find.1.en.md",
        "findutils",
        f"{EN_MAN}/man1/find.1.gz",
        "man",
        "GPL-3.0-or-later",
        ("findutils.copyright", "GPL-3"),
        "en",
    ),
    Source(
        "grep.1.en.md",
        "grep",
        f"{EN_MAN}/man1/grep.1.gz",
        "man",
        "GPL-3.0-or-later",
        ("grep.copyright", "GPL-3"),
        "en",
    ),
    Source(
        "gzip.1.en.md",
        "gzip",
        f"{EN_MAN}/man1/gzip.1.gz",
        "man",
        "GPL-3.0-or-later",
        ("gzip.copyright", "GPL-3"),
        "en",
    ),
    Source(
        "systemd.timer.5.en.md",
        "systemd",
        f"{EN_MAN}/man5/systemd.timer.5.gz",
        "man",
        "LGPL-2.1-or-later",
        ("systemd.copyright", "LGPL-2.1"),
        "en",
    ),
    Source(
        "journalctl.1.en.md",
        "systemd",
        f"{EN_MAN}/man1/journalctl.1.gz",
        "man",
        "LGPL-2.1-or-later",
        ("systemd.copyright", "LGPL-2.1"),
        "en",
    ),
    Source(
        "useradd.8.en.md",
        "passwd",
        f"{EN_MAN}/man8/useradd.8.gz",
        "man",
        "BSD-3-Clause (shadow)",
        ("passwd.copyright",),
        "en",
    ),
)

_SPDX = re.compile(r"SPDX-License-Identifier:\s*(\S+)|%%%LICENSE_START\((\w+)\)")


def fetch(packages: list[str], work: Path) -> dict[str, tuple[str, Path]]:
    """Download and unpack Debian packages; returns package -> (version, unpacked root)."""
    debs = work / "debs"
    debs.mkdir()
    subprocess.run(["apt-get", "download", *packages], cwd=debs, check=True)
    out: dict[str, tuple[str, Path]] = {}
    for deb in sorted(debs.glob("*.deb")):
        name = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Package"], check=True, capture_output=True, text=True
        ).stdout.strip()
        version = subprocess.run(
            ["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True, text=True
        ).stdout.strip()
        root = work / "x" / name
        root.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        out[name] = (version, root)
    return out


_MARK = {"SH": "@@SH@@", "SS": "@@SS@@", "Sh": "@@SH@@", "Ss": "@@SS@@"}
_HEADING_MACRO = re.compile(r"^\.(SH|SS|Sh|Ss)(?:\s+(.*))?$")


def mark_headings(source: str) -> str:
    """Prefix every .SH/.SS (mdoc .Sh/.Ss) title with a marker, so the rendered text says which lines are titles."""
    out: list[str] = []
    pending = ""
    for line in source.split("\n"):
        if pending and not line.startswith('.\\"'):
            if line.startswith("."):
                # A font macro carries the title: `.B title` -> `.B <marker>title`.
                macro, _, args = line.partition(" ")
                args = args.strip()
                quote = '"' if args.startswith('"') else ""
                line = f"{macro} {quote}{pending}{args[len(quote) :]}"
            else:
                line = pending + line
            out.append(line)
            pending = ""
            continue
        match = _HEADING_MACRO.match(line)
        if match:
            marker = _MARK[match.group(1)]
            title = (match.group(2) or "").strip()
            if not title:
                out.append(line)
                pending = marker
                continue
            if title.startswith('"'):
                title = '"' + marker + title[1:]
            else:
                title = marker + title
            line = f".{match.group(1)} {title}"
        out.append(line)
    return "\n".join(out)


def render_man(source: bytes, title: str) -> str:
    """Render a man page with groff and turn its layout into Markdown headings and paragraphs."""
    marked = mark_headings(source.decode("utf-8")).encode("utf-8")
    text = subprocess.run(
        ["groff", "-k", "-mandoc", "-Tutf8", "-P-cbou", "-rLL=200n", "-rHY=0", "-rcR=1"],
        input=marked,
        check=True,
        capture_output=True,
    ).stdout.decode("utf-8")
    lines = text.split("\n")
    # Drop the running header and footer that groff prints.
    body = [ln.rstrip() for ln in lines[1:]]
    while body and not body[-1].strip():
        body.pop()
    if body:
        body.pop()
    out = [f"# {title}", ""]
    para: list[str] = []

    def flush() -> None:
        if para:
            joined = " ".join(" ".join(p.split()) for p in para)
            # A paragraph that starts with '#' (code, shell comments) must not read as a heading.
            out.append("\\" + joined if joined.startswith("#") else joined)
            out.append("")
            para.clear()

    for line in body:
        stripped = line.strip()
        if not stripped:
            flush()
        elif stripped.startswith(_MARK["SH"]):
            flush()
            out.extend([f"## {stripped.removeprefix(_MARK['SH']).strip()}", ""])
        elif stripped.startswith(_MARK["SS"]):
            flush()
            out.extend([f"### {stripped.removeprefix(_MARK['SS']).strip()}", ""])
        else:
            para.append(stripped)
    flush()
    return "\n".join(out).rstrip() + "\n"


_NUMBERED = re.compile(r"^\d+(\.\d+)*\.\s+\S")
_CHAPTER = re.compile(r"^Глава (\d+)\.\s+(.*)$")


def clean_faq_txt(text: str) -> str:
    """Drop the table of contents, turn 'Глава N. X' into 'N. X', unwrap wrapped headings."""
    lines = text.split("\n")
    start = next(i for i, ln in enumerate(lines) if _CHAPTER.match(ln))
    toc = next(i for i, ln in enumerate(lines) if ln.strip() == "Содержание")
    kept = lines[:toc] + lines[start:]
    out: list[str] = []
    i = 0
    while i < len(kept):
        line = kept[i]
        chapter = _CHAPTER.match(line)
        if chapter:
            line = f"{chapter.group(1)}. {chapter.group(2)}"
        if _NUMBERED.match(line):
            # A heading starts at column 0; its wrapped continuation lines do too.
            while i + 1 < len(kept) and kept[i + 1].strip() and not kept[i + 1].startswith(" "):
                i += 1
                line = f"{line} {kept[i].strip()}"
        out.append(line)
        i += 1
    return "\n".join(out)


def build(work: Path) -> None:
    """Fetch every package, write the corpus files, the licences and SOURCES.md."""
    packages = sorted({s.package for s in SOURCES})
    unpacked = fetch(packages, work)
    for old in CORPUS.glob("*.*"):
        if old.name != "SOURCES.md":
            old.unlink()
    licences = CORPUS / "LICENSES"
    shutil.rmtree(licences, ignore_errors=True)
    licences.mkdir(parents=True)
    rows = []
    for src in SOURCES:
        version, root = unpacked[src.package]
        raw = (root / src.path.lstrip("/")).read_bytes()
        licence = src.licence
        if src.kind == "pdf":
            data = raw
        elif src.kind == "pdf.gz":
            data = gzip.decompress(raw)
        elif src.kind == "faq-txt":
            data = clean_faq_txt(gzip.decompress(raw).decode("utf-8")).encode("utf-8")
        else:
            page = gzip.decompress(raw)
            if not licence:
                found = _SPDX.search(page.decode("utf-8", "replace"))
                original = (found.group(1) or found.group(2)) if found else ""
                if not original and b"GNU coreutils" in page:
                    original = "GPL-3.0-or-later (GNU coreutils)"
                licence = f"original: {original}; {L10N}"
            name, section = src.out.split(".")[:-2], src.out.split(".")[-3]
            data = render_man(page, f"{'.'.join(name[:-1])}({section})").encode("utf-8")
        (CORPUS / src.out).write_bytes(data)
        copyright_file = root / "usr/share/doc" / src.package / "copyright"
        shutil.copyfile(copyright_file, licences / f"{src.package}.copyright")
        for name in src.licence_files:
            if not name.endswith(".copyright"):
                shutil.copyfile(COMMON_LICENSES / name, licences / name)
        rows.append(
            f"| `{src.out}` | {src.lang} | {len(data):,} | {src.package} {version} | "
            f"`{src.path}` | {licence} | {', '.join(f'`LICENSES/{n}`' for n in src.licence_files)} |"
        )
    table = "\n".join(rows)
    (CORPUS / "SOURCES.md").write_text(SOURCES_MD.format(table=table), encoding="utf-8")


SOURCES_MD = """# Sources of the gold-set corpus

Every file here is a real third-party document taken from a Debian 12 (bookworm) package,
under a free licence. `bench/quality/build_corpus.py` rebuilds this directory from the
packages (`apt-get download`, `dpkg-deb -x`, `groff`); the table is generated by it.

How each kind was turned into a corpus file:

- **PDF** (`*.pdf`): the package's PDF, byte for byte (`.pdf.gz` decompressed). Page numbers
  in the judgments are physical pages, 1-based (the PDF page index + 1), not the numbers
  printed in the page footer.
- **Man pages** (`*.md`): the package's troff source rendered with
  `groff -k -man -Tutf8 -P-cbou` and converted to Markdown: `# name(section)` on top, each
  `.SH` heading a `##` heading, each `.SS` heading a `###` heading, each paragraph joined
  into one line. Words are unchanged.
- **Debian FAQ in Russian** (`debian-faq.ru.txt`): the package's text version, with the table
  of contents removed (its lines look like numbered headings), `Глава N. X` written as
  `N. X`, and headings that were wrapped over several lines joined into one line. Words are
  unchanged.

| file | lang | bytes | package version | original path | licence | licence texts |
| --- | --- | --- | --- | --- | --- | --- |
{table}

`LICENSES/<package>.copyright` is the package's `/usr/share/doc/<package>/copyright`;
`GPL-2`, `GPL-3`, `LGPL-2.1` are `/usr/share/common-licenses/` of Debian's `base-files`.
"""


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the download directory")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="visior-corpus-"))
    try:
        build(work)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {len(SOURCES)} files to {CORPUS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
