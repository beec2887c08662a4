"""The JSON documents of a file, as bytes, one at a time, with their line numbers.

Why bytes: a ``/server_info`` body is tens of MB; its one decoder
(:func:`collectors.sglang.decode.decode_server_info`) reads bytes, so parsing
the document into Python first (stdlib ``json``) would parse it twice and
hold it twice.  Documents come one per line, or run together with nothing
between them, as ``curl -s URL/server_info >> FILE`` leaves them (the server
writes no newline).  The file is read in chunks; a document's end is found
by msgspec's validating scan (``type=msgspec.Raw``, no values built), so
memory stays at about one document, however long the line.

A regular file is mapped (``mmap``) rather than read: a document is a view of
the mapping, never copied into a buffer that grows as it is read (a first
18 MB body took 57 MB of copies that way), and the pages of the documents
already handed out are given back (``MADV_DONTNEED``: they stay in the page
cache, and are read again if a caller still looks at them).  A pipe or an
empty file is read in chunks as before.

With ``decode`` (the caller's one decoder, e.g. ``decode_server_info``), a
whole line already in the buffer goes to it first (with ``releasing``, and
``release=`` a mapped document's :attr:`Document.release`: the decoder gives
back the pages it has read as it goes) and comes back with its value: for a
file of one document per line that is the only parse, and the document is not
copied out of the read buffer (``data`` is a memoryview).  A line
``decode`` refuses (two documents run together, text that is not JSON, a
document of another kind) is split by the scan as above.

A document msgspec does not accept (``NaN``/``Infinity`` as Python's
``json.dumps`` writes them, or text that is not JSON) goes through the
stdlib decoder; what that accepts comes back with its values and as
standard JSON bytes (non-finite numbers as ``null``, as the server's
encoder writes them), the rest as an error with the text.
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import msgspec

CHUNK_BYTES = 8 << 20
_WHITESPACE = b" \t\r\n"


@dataclass(frozen=True)
class Document:
    """One JSON document of a file: ``data`` (standard JSON bytes) or ``error`` (with ``text``)."""

    line: int  # 1-based line on which the document starts
    data: Optional[bytes | memoryview]  # a view of the mapped file or the read buffer where it could be (no copy)
    error: Optional[str] = None
    text: str = ""  # the document's text when it is not JSON (for a dead letter)
    parsed: Any = None  # the stdlib's values, for a document only it reads (they keep NaN and infinities)
    decoded: Any = None  # what the caller's ``decode`` made of it, when it read the line whole
    release: Optional[Callable[[int], None]] = None  # gives back the pages of the first n bytes (mapped files)

    def value(self) -> Any:
        """The document as Python values."""
        return self.parsed if self.parsed is not None else msgspec.json.decode(self.data)


def iter_documents(path: str | Path, chunk_bytes: int = CHUNK_BYTES,
                   decode: Optional[Callable[..., Any]] = None, *, releasing: bool = False) -> Iterator[Document]:
    """Each JSON document of ``path`` in order; text that is not JSON ends its line as one error.

    ``decode`` raises (``ValueError``, ``TypeError``, ``OverflowError``) for a line it cannot read as one document.
    ``releasing``: ``decode`` takes ``release=`` (on a mapped file, :attr:`Document.release`; else None).

    >>> import tempfile, os
    >>> f = tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False)
    >>> _ = f.write(b'{"a": 1}{"a": 2}\\n\\n{"a": NaN} oops\\n[3]'); f.close()
    >>> [(d.line, d.data if d.data is None else bytes(d.data), d.error is not None) for d in iter_documents(f.name)]
    [(1, b'{"a": 1}', False), (1, b'{"a": 2}', False), (3, b'{"a":null}', False), (3, None, True), (4, b'[3]', False)]
    >>> os.unlink(f.name)
    """
    with open(path, "rb") as f:
        mapped = _mapped(f)
        if mapped is not None:
            yield from _mapped_documents(mapped, chunk_bytes, decode, releasing)
            return
        buf, line, eof, typical = b"", 1, False, 0
        while True:
            start = _skip_whitespace(buf)
            line += _newlines(buf, start)
            buf = buf[start:]
            if not eof and len(buf) < max(chunk_bytes, typical + typical // 4):
                # Hold the next document whole before scanning it: a scan cannot resume.
                buf, eof = _read(f, max(chunk_bytes, typical + typical // 4) - len(buf), buf)
                continue
            if not buf:
                return
            if decode is not None:
                whole = _decoded_line(buf, eof, decode)
                if whole is not None:
                    stop = whole[0]
                    yield Document(line, whole[1], decoded=whole[2])
                    whole = None  # let the caller free the document before the next one is read and decoded
                    typical = max(typical, stop)
                    buf = buf[stop:]
                    continue
            end = _document_end(buf)
            if end is None and not eof:  # longer than we guessed: read as much again and rescan
                buf, eof = _read(f, len(buf), buf)
                continue
            if end:
                stop = end
                while buf[stop - 1] in _WHITESPACE:  # not rstrip: that would copy the document
                    stop -= 1
                yield Document(line, buf[:stop] if stop < len(buf) else buf)
                typical = max(typical, end)
                line += _newlines(buf, end)
                buf = buf[end:]
                continue
            # Not standard JSON: the stdlib decoder on the rest of the line (NaN, or an error).
            while b"\n" not in buf and not eof:
                buf, eof = _read(f, len(buf), buf)
            stop = buf.find(b"\n")
            stop = len(buf) if stop < 0 else stop
            yield from _stdlib_documents(line, buf[:stop])
            buf = buf[stop:]


def iter_json_documents(path: str | Path) -> Iterator[tuple[int, Any, Optional[str], str]]:
    """``(line, value, error, text)`` of each document of ``path``: :func:`iter_documents` as Python values.

    ``error`` is set (and ``value`` None) for text that is not JSON.
    """
    for doc in iter_documents(path):
        if doc.error is not None:
            yield doc.line, None, doc.error, doc.text
        else:
            yield doc.line, doc.value(), None, bytes(doc.data).decode("utf-8", "replace")


def _decoded_line(buf: bytes, eof: bool, decode: Callable[[bytes], Any]) -> Optional[tuple[int, bytes, Any]]:
    """``(end, data, value)`` when the first line of ``buf`` is whole and ``decode`` reads it; else None.

    Only a line already held is tried (a file with no newlines is split by the
    scan, never read whole); its newline is left for the caller to count.
    """
    stop = buf.find(b"\n")
    if stop < 0:
        if not eof:
            return None
        stop = len(buf)
    whole = _decoded_view(memoryview(buf), 0, stop, decode)  # a view: a slice would copy the document
    return None if whole is None else (stop, *whole)


def _mapped(f) -> Optional[mmap.mmap]:
    """The file mapped read-only; None for what cannot be mapped (a pipe, an empty file)."""
    try:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _mapped_documents(mm: mmap.mmap, chunk_bytes: int, decode: Optional[Callable[..., Any]],
                      releasing: bool = False) -> Iterator[Document]:
    """:func:`iter_documents` over a mapped file: the same documents and lines, as views of the mapping.

    As with a buffer, ``decode`` is tried only on a line that ends within ``max(chunk_bytes, 1.25 x the
    longest document so far)`` of its start (a file of documents run together on one line is split by the
    scan, never searched to its end for each document)."""
    view, size = memoryview(mm), len(mm)
    pos, line, typical, given_back = 0, 1, 0, 0
    try:
        while True:
            start = pos
            while pos < size and mm[pos] in _WHITESPACE:
                pos += 1
            line += _mapped_newlines(mm, start, pos)
            given_back = _give_back(mm, given_back, pos)
            if pos >= size:
                return
            if decode is not None:
                window = max(chunk_bytes, typical + typical // 4)
                stop = mm.find(b"\n", pos, pos + window)
                stop = size if stop < 0 and pos + window >= size else stop
                release = _page_giver(mm, pos) if releasing else None
                whole = None if stop < 0 else _decoded_view(view, pos, stop, decode, release)
                if whole is not None:
                    # decoded: its pages go back now (a caller that reads the bytes again faults them in)
                    given_back = _give_back(mm, given_back, stop)
                    typical, pos = max(typical, stop - pos), stop
                    yield Document(line, whole.pop(0), decoded=whole.pop(),  # not held here while the caller works
                                   release=release or _page_giver(mm, pos))
                    continue
            end = _document_end(view[pos:])
            if end:
                stop = end
                while mm[pos + stop - 1] in _WHITESPACE:
                    stop -= 1
                yield Document(line, view[pos:pos + stop], release=_page_giver(mm, pos))
                typical = max(typical, end)
                line += _mapped_newlines(mm, pos, pos + end)
                pos += end
                continue
            stop = mm.find(b"\n", pos)  # not standard JSON: the stdlib decoder on the rest of the line
            stop = size if stop < 0 else stop
            yield from _stdlib_documents(line, mm[pos:stop])
            pos = stop
    finally:
        view.release()
        try:
            mm.close()
        except BufferError:  # a caller still holds a document: the mapping closes when it lets go
            pass


def _decoded_view(view: memoryview, pos: int, stop: int, decode: Callable[..., Any],
                  release: Optional[Callable[[int], None]] = None) -> Optional[list]:
    """``[data, value]`` of the line ``view[pos:stop]`` (trailing white space off) when ``decode`` reads it
    (given ``release``, the line's :attr:`Document.release`, when there is one)."""
    end = stop
    while end > pos and view[end - 1] in _WHITESPACE:
        end -= 1
    data = view[pos:end]
    try:
        return [data, decode(data) if release is None else decode(data, release=release)]
    except (ValueError, TypeError, OverflowError):  # msgspec's errors are ValueErrors; the scan decides
        return None


def _mapped_newlines(mm: mmap.mmap, start: int, end: int) -> int:
    """Newlines in ``mm[start:end]`` (copied only when there is one: a server's compact JSON has none)."""
    return 0 if mm.find(b"\n", start, end) < 0 else mm[start:end].count(b"\n")


def _page_giver(mm: mmap.mmap, start: int) -> Optional[Callable[[int], None]]:
    """:attr:`Document.release` of the document at ``start``: drops the whole pages of its first ``n`` bytes
    from resident memory (the file's pages: safe to drop, read again if touched)."""
    if not (hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED")):
        return None
    first = start - start % mmap.PAGESIZE

    def release(n: int) -> None:
        upto = start + min(max(n, 0), len(mm) - start)
        upto -= upto % mmap.PAGESIZE
        if upto > first:
            mm.madvise(mmap.MADV_DONTNEED, first, upto - first)
    return release


def _give_back(mm: mmap.mmap, given_back: int, pos: int) -> int:
    """Drop the whole pages before ``pos`` from the process's resident memory; the new mark."""
    upto = pos - pos % mmap.PAGESIZE
    if upto > given_back and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        mm.madvise(mmap.MADV_DONTNEED, given_back, upto - given_back)
        return upto
    return given_back


def _read(f, size: int, buf: bytes) -> tuple[bytes, bool]:
    more = f.read(size)
    return buf + more, not more


def _newlines(buf: bytes, end: int) -> int:
    """Newlines in ``buf[:end]``; a server's compact JSON has none, which ``find`` (memchr) tells fast."""
    return 0 if buf.find(b"\n", 0, end) < 0 else buf.count(b"\n", 0, end)


def _skip_whitespace(buf: bytes) -> int:
    return len(buf) - len(buf.lstrip(_WHITESPACE))


def _document_end(buf: bytes) -> Optional[int]:
    """Where the standard-JSON document at the start of ``buf`` ends (white space after it may count):
    None if it is cut short, 0 if it is not JSON."""
    try:
        msgspec.json.decode(buf, type=msgspec.Raw)
        return len(buf)
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "truncated" in message:
            return None
        if "trailing characters (byte " in message:
            return int(message.rsplit("(byte ", 1)[1].rstrip(")")) - 1  # msgspec counts the byte it read
        return 0


def _stdlib_documents(line: int, data: bytes) -> Iterator[Document]:
    """What the stdlib decoder reads of one line; the rest of the line after an error is one error."""
    text, pos, decoder = data.decode("utf-8", "replace"), 0, json.JSONDecoder()
    while pos < len(text):
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield Document(line, None, f"not JSON: {exc}", text[pos:])
            return
        yield Document(line, msgspec.json.encode(value), parsed=value)
        pos = end
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
