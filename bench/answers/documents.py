"""The answer harness's documents: fetched from pinned Debian packages, converted, hash-checked.

Nothing here is committed but this script: `prepare()` downloads the packages with
`apt-get download <pkg>=<version>`, unpacks them with `dpkg-deb -x`, converts what needs it
(man pages: groff -> Markdown, see bench/quality/build_corpus.render_man, then cut into pages
with form feeds, which the docstore reads as page breaks) and checks every file's sha256, so a
drifted document fails loudly instead of silently moving the gold pages.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.quality.build_corpus import render_man  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
"""Default cache (ignored by git: bench/answers/.gitignore)."""

PAGE_CHARS = 2500
"""A man page's Markdown is cut into pages of about this many characters, at paragraph ends."""


class DocumentError(RuntimeError):
    """A document could not be fetched, or is not the one the gold set was written on."""


@dataclass(frozen=True)
class Doc:
    name: str
    """File name ingested (and used in the gold set)."""
    package: str
    version: str
    path: str
    """Path inside the package."""
    kind: str
    """pdf (byte for byte), man-md (groff -> Markdown with form-feed pages)."""
    lang: str
    sha256: str
    title: str = ""


DOCS: tuple[Doc, ...] = (
    Doc(
        "maint-guide.en.pdf",
        "maint-guide",
        "1.2.53",
        "/usr/share/doc/maint-guide/maint-guide.en.pdf",
        "pdf",
        "en",
        "0b94abf28167fb3fe59db3d03f99b5faa50d9f6f696a7864825c5d0378ba27ef",
    ),
    Doc(
        "maint-guide.ru.pdf",
        "maint-guide-ru",
        "1.2.53",
        "/usr/share/doc/maint-guide-ru/maint-guide.ru.pdf",
        "pdf",
        "ru",
        "5e15ad39186549e49ee6dd1ce09873f0c90fc36e865410272b3f02ae358629ad",
    ),
    Doc(
        "fanotify.7.ru.md",
        "manpages-ru",
        "4.18.1-1",
        "/usr/share/man/ru/man7/fanotify.7.gz",
        "man-md",
        "ru",
        "ad68e0444b3ac8f4b2de8a8e71cd4182d614bc394d48fb862f9e50ef643c3b57",
        "fanotify(7)",
    ),
    Doc(
        "core.5.ru.md",
        "manpages-ru",
        "4.18.1-1",
        "/usr/share/man/ru/man5/core.5.gz",
        "man-md",
        "ru",
        "49f516087fe6f20cff5a93b97b74519e0c2613a90dcc7df7f4d707efdd5ff5ec",
        "core(5)",
    ),
)


def by_name() -> dict[str, Doc]:
    return {d.name: d for d in DOCS}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def paginate(markdown: str, page_chars: int = PAGE_CHARS) -> str:
    """Cut Markdown into pages (joined with form feeds) at paragraph ends, ~`page_chars` each."""
    pages: list[list[str]] = [[]]
    size = 0
    for block in markdown.rstrip("\n").split("\n\n"):
        if size >= page_chars and pages[-1]:
            pages.append([])
            size = 0
        pages[-1].append(block)
        size += len(block) + 2
    return "\f".join("\n\n".join(p) + "\n" for p in pages)


def page_texts(path: Path) -> list[str]:
    """Each page's text: the PDF's pages (pypdfium2), or the form-feed pages of a text file."""
    if path.suffix == ".pdf":
        import pypdfium2 as pdfium

        pdf = pdfium.PdfDocument(path.read_bytes())
        try:
            return [pdf[i].get_textpage().get_text_range() for i in range(len(pdf))]
        finally:
            pdf.close()
    return path.read_text(encoding="utf-8").split("\f")


def _fetch(docs: tuple[Doc, ...], work: Path) -> dict[str, Path]:
    """apt-get download the pinned packages and unpack them; package -> unpacked root."""
    wanted = sorted({(d.package, d.version) for d in docs})
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["apt-get", "download", *(f"{p}={v}" for p, v in wanted)],
            cwd=debs,
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise DocumentError(
            f"apt-get download failed ({detail.strip()}); run `apt-get update` once, "
            "and check that the pinned versions are still in the archive"
        ) from exc
    roots: dict[str, Path] = {}
    for pkg, _ in wanted:
        deb = next(debs.glob(f"{pkg}_*.deb"))
        root = work / "x" / pkg
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        roots[pkg] = root
    return roots


def _convert(doc: Doc, original: Path, out: Path) -> None:
    raw = original.read_bytes()
    if original.suffix == ".gz":
        raw = gzip.decompress(raw)
    if doc.kind == "pdf":
        out.write_bytes(raw)
    elif doc.kind == "man-md":
        out.write_text(paginate(render_man(raw, doc.title or doc.name)), encoding="utf-8")
    else:
        raise DocumentError(f"unknown kind {doc.kind!r}")


def prepare(cache: Path = CACHE, *, check_hashes: bool = True) -> dict[str, Path]:
    """Every document in `cache`/docs (fetched and converted when missing), hash-checked."""
    out_dir = cache / "docs"
    out_dir.mkdir(parents=True, exist_ok=True)
    missing = tuple(d for d in DOCS if not (out_dir / d.name).is_file())
    if missing:
        with tempfile.TemporaryDirectory(prefix="answers-debs-") as tmp:
            roots = _fetch(missing, Path(tmp))
            for doc in missing:
                original = roots[doc.package] / doc.path.lstrip("/")
                if not original.is_file():
                    raise DocumentError(f"{doc.package} {doc.version} has no {doc.path}")
                part = out_dir / (doc.name + ".part")
                _convert(doc, original, part)
                part.replace(out_dir / doc.name)
    paths = {d.name: out_dir / d.name for d in DOCS}
    if check_hashes:
        bad = [
            f"{d.name}: sha256 {sha256(paths[d.name])}, the gold set was written on {d.sha256}"
            for d in DOCS
            if sha256(paths[d.name]) != d.sha256
        ]
        if bad:
            raise DocumentError(
                "documents differ from the gold set's (delete "
                f"{out_dir} to fetch again; a new package version needs new gold pages):\n  "
                + "\n  ".join(bad)
            )
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--refetch", action="store_true", help="delete the cached documents first")
    p.add_argument("--print-hashes", action="store_true", help="print sha256 without checking")
    a = p.parse_args(argv)
    if a.refetch and (a.cache / "docs").exists():
        shutil.rmtree(a.cache / "docs")
    try:
        paths = prepare(a.cache, check_hashes=not a.print_hashes)
    except DocumentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{len(page_texts(path))} pages\t{sha256(path)}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
