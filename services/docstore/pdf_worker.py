"""PDFs read in a worker process whose memory is capped.

PDFium expands a page whole while it reads it: a 30 KB file of one Flate-compressed page
takes about 1 GB, before any bound on the text can be checked, and when memory runs out
PDFium aborts the process. So the Retrieval service reads PDFs in a child process
(`python -m services.docstore.pdf_worker LIMIT`) whose address space is held to LIMIT bytes
(RLIMIT_AS; `MEMORY_BYTES` in the service): a PDF that needs more ends that worker, not the service, and is refused
(`PdfMemoryLimitError`); a PDF that crashes PDFium is refused as unreadable. The next PDF
starts a new worker.

The protocol on the child's stdin and stdout: a request is a 16-byte header (the file's
length, the text bound; big-endian) and the file; an answer is an 8-byte length and a pickle
of ("ok", PdfText), ("text_limit", message, limit), ("parse", message) or ("memory",).
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import struct
import subprocess
import sys
import threading
import traceback
from typing import IO, Any

from services.docstore.errors import DocumentLimitError, ParseError
from services.docstore.pdf import MAX_TEXT_BYTES, PdfText, read_pdf

MEMORY_BYTES = 8 * MAX_TEXT_BYTES
"""The address space the worker may take: 1 GiB. It holds a PDF whose text is at the text
bound (`MAX_TEXT_BYTES`, 128 MiB of UTF-8: up to 512 MB as Python strings, and a pickled
copy to send) with room for PDFium's own state of one page; the sample and benchmark PDFs
read within 128 MiB. A 30 KB file of one Flate-compressed page needs about 1 GB. A constant
like the text bound it follows."""

READ_SECONDS = 120.0
"""How long the worker may read one PDF: 10,000 pages at the text bound take about 25 s on
2 cores, the sample and benchmark PDFs well under a second. A constant like the memory cap."""

_REQUEST = struct.Struct(">QQ")
_ANSWER = struct.Struct(">Q")
_MAX_REASON = 200  # characters of an unexpected error's text in the refusal


class PdfMemoryLimitError(DocumentLimitError):
    """Reading the PDF needs more memory than the worker may take (`limit` bytes)."""

    limit_name = "max_pdf_memory_bytes"


class PdfTimeLimitError(DocumentLimitError):
    """Reading the PDF took longer than the worker may take (`limit` seconds)."""

    limit_name = "max_pdf_read_seconds"


class PdfWorker:
    """`read_pdf` in a child process capped at `memory_bytes` of address space and
    `read_seconds` a PDF. One PDF at a time (PDFium reads one document at a time per process
    anyway); thread-safe. The child starts at the first PDF and again after one that ended
    it, in a session of its own (a terminal's Ctrl-C is the service's to handle)."""

    def __init__(
        self,
        memory_bytes: int = MEMORY_BYTES,
        *,
        read_seconds: float = READ_SECONDS,
        command: tuple[str, ...] | None = None,
    ) -> None:
        self.memory_bytes = memory_bytes
        self.read_seconds = read_seconds
        self._command = command or (sys.executable, "-m", __name__, str(memory_bytes))
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._overran: subprocess.Popen[bytes] | None = None  # a child killed at its limit
        self._closed = False

    def __call__(self, content: bytes, *, max_text_bytes: int = MAX_TEXT_BYTES) -> PdfText:
        with self._lock:
            if self._closed:
                raise ParseError("cannot read the PDF: the service is stopping")
            if self._child is not None and self._child.poll() is not None:
                _stop(self._child)  # ended between PDFs (killed): start another
                self._child = None
            child = self._child = self._child or self._start()
            assert child.stdin is not None and child.stdout is not None
            limit = threading.Timer(self.read_seconds, self._overrun, args=(child,))
            limit.daemon = True
            limit.start()
            try:
                child.stdin.write(_REQUEST.pack(len(content), max_text_bytes))
                child.stdin.write(content)
                child.stdin.flush()
                answer = _read_answer(child.stdout)
            except (OSError, EOFError, ValueError):  # ValueError: a pipe closed under it
                raise self._ended(child) from None
            finally:
                limit.cancel()
        return _result(answer, self.memory_bytes)

    def close(self) -> None:
        """Stop the child: an idle one ends when its stdin closes; one reading a PDF is
        killed (that read fails), without waiting for it. Later calls are refused."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                child, self._child = self._child, None
            finally:
                self._lock.release()
            if child is not None:
                _stop(child)
        elif (child := self._child) is not None:
            child.kill()  # the reading thread sees it end and cleans up

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True
        )

    def _overrun(self, child: subprocess.Popen[bytes]) -> None:
        self._overran = child
        child.kill()

    def _ended(self, child: subprocess.Popen[bytes]) -> ParseError:
        """The error for a PDF during which the child ended."""
        self._child = None
        code = _stop(child)
        if self._overran is child:
            return PdfTimeLimitError(
                f"reading the PDF took more than {self.read_seconds:g} s: its pages are more "
                "than one document may hold",
                limit=self.read_seconds,
            )
        if self._closed:
            return ParseError("cannot read the PDF: the service is stopping")
        if code in (-signal.SIGABRT, -signal.SIGKILL):  # PDFium's out-of-memory abort; OOM killer
            return _memory_error(self.memory_bytes)
        return ParseError(f"cannot read the PDF: the reader ended on it (exit status {code})")


def _stop(child: subprocess.Popen[bytes]) -> int:
    for pipe in (child.stdin, child.stdout):
        try:
            if pipe is not None:
                pipe.close()
        except OSError:
            pass
    try:
        return child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _memory_error(limit: int) -> PdfMemoryLimitError:
    return PdfMemoryLimitError(
        f"reading the PDF needs more than {limit} bytes of memory: its compressed pages expand "
        "past what one document may take",
        limit=limit,
    )


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _read_answer(stream: IO[bytes]) -> Any:
    (size,) = _ANSWER.unpack(_read_exact(stream, _ANSWER.size))
    return pickle.loads(_read_exact(stream, size))


def _result(answer: Any, memory_bytes: int) -> PdfText:
    kind = answer[0]
    if kind == "ok":
        text: PdfText = answer[1]
        return text
    if kind == "limit":  # a DocumentLimitError of read_pdf's (text, pages), by its class
        raise answer[1](answer[2], limit=answer[3])
    if kind == "memory":
        raise _memory_error(memory_bytes)
    raise ParseError(answer[1])


def _answer(content: bytes, max_text_bytes: int) -> tuple[Any, ...]:
    try:
        return ("ok", read_pdf(content, max_text_bytes=max_text_bytes))
    except DocumentLimitError as exc:
        return ("limit", type(exc), str(exc), exc.limit)
    except ParseError as exc:
        return ("parse", str(exc))
    except MemoryError:
        return ("memory",)
    except Exception as exc:  # a reader's bug on this PDF: refuse it, not every PDF after it
        traceback.print_exc(file=sys.stderr)  # the service's stderr, where its logs go
        reason = f"{type(exc).__name__}: {exc}"[:_MAX_REASON]
        return ("parse", f"cannot read the PDF: the reader failed on it ({reason})")


def serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer requests until `requests` ends."""
    while header := requests.read(_REQUEST.size):
        if len(header) != _REQUEST.size:
            return
        size, max_text_bytes = _REQUEST.unpack(header)
        answer = pickle.dumps(_answer(_read_exact(requests, size), max_text_bytes))
        answers.write(_ANSWER.pack(len(answer)) + answer)
        answers.flush()


def main(argv: list[str]) -> None:
    limit = int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of ~1 GiB per abort
    # The answers get the real stdout; anything else written to it (a library's message)
    # goes to stderr instead of into the protocol.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main(sys.argv)
