"""The JSON documents of an imported file: split as bytes, whatever the layout, in bounded chunks."""

from __future__ import annotations

import json

import msgspec
import pytest

from collectors.importers import documents

from collectors.importers.documents import iter_documents, iter_json_documents

DOCS = [{"a": i, "s": "x}{\"]" * i, "l": list(range(i * 50))} for i in range(6)]


def _write(tmp_path, data: bytes):
    path = tmp_path / "docs.jsonl"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
@pytest.mark.parametrize("sep", [b"\n", b"", b"  \r\n\n"])
def test_documents_come_back_byte_exact_whatever_the_separator_and_chunk(tmp_path, sep, chunk):
    encoded = [json.dumps(d, separators=(",", ":")).encode() for d in DOCS]
    path = _write(tmp_path, sep.join(encoded) + sep)
    got = list(iter_documents(path, chunk_bytes=chunk))
    assert [d.data for d in got] == encoded and all(d.error is None for d in got)
    assert [d.value() for d in got] == DOCS
    lines = sep.count(b"\n")
    assert [d.line for d in got] == [1 + i * lines for i in range(len(DOCS))]


def test_a_pretty_printed_document_is_one_document_on_its_first_line(tmp_path):
    path = _write(tmp_path, b"\n" + json.dumps(DOCS[2], indent=2).encode() + b"\n" + json.dumps(DOCS[1]).encode())
    got = list(iter_json_documents(path))
    assert [(line, value) for line, value, _, _ in got] == [(2, DOCS[2]), (2 + json.dumps(DOCS[2], indent=2).count("\n") + 1, DOCS[1])]


def test_non_finite_numbers_keep_their_values_and_become_null_in_the_bytes(tmp_path):
    path = _write(tmp_path, b'{"x": NaN, "y": -Infinity}{"z": 1}\n')
    first, second = iter_documents(path)
    assert first.data == b'{"x":null,"y":null}' and first.value()["y"] == float("-inf")
    assert second.value() == {"z": 1} and second.line == 1


def test_text_that_is_not_json_ends_its_line_and_the_next_line_is_read(tmp_path):
    path = _write(tmp_path, b'{"a": 1} not json {"b": 2}\n{"c": 3}\n{"cut": [1, 2')
    got = list(iter_documents(path, chunk_bytes=8))
    assert [(d.line, d.error is None) for d in got] == [(1, True), (1, False), (2, True), (3, False)]
    assert got[1].text.startswith("not json") and "cut" in got[3].text


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
@pytest.mark.parametrize("sep", [b"\n", b"", b"  \r\n\n"])
def test_with_a_decoder_the_documents_are_the_same_and_a_line_is_parsed_once(tmp_path, monkeypatch, sep, chunk):
    encoded = [json.dumps(d, separators=(",", ":")).encode() for d in DOCS]
    path = _write(tmp_path, sep.join(encoded) + sep)
    plain = list(iter_documents(path, chunk_bytes=chunk))
    scans, calls = [], []
    real_end = documents._document_end
    monkeypatch.setattr(documents, "_document_end", lambda buf: scans.append(1) or real_end(buf))

    def decode(data: bytes):
        calls.append(data)
        return msgspec.json.decode(data)

    got = list(iter_documents(path, chunk_bytes=chunk, decode=decode))
    assert [(d.line, d.data) for d in got] == [(d.line, d.data) for d in plain]
    assert [d.decoded if d.decoded is not None else d.value() for d in got] == DOCS
    if sep and chunk > len(b"".join(encoded)):  # every line held whole: each parsed once, no scan
        assert calls == encoded and not scans and all(d.decoded is not None for d in got)


def test_a_line_the_decoder_refuses_is_split_by_the_scan(tmp_path):
    path = _write(tmp_path, b'{"a": 1}{"a": 2}\n{"b": 3} oops\n{"a": 4}\n')

    def only_a(data: bytes):
        value = msgspec.json.decode(data)
        if "a" not in value:
            raise ValueError("not an a")
        return value

    got = list(iter_documents(path, decode=only_a))
    assert [(d.line, d.data, d.error is None) for d in got] == [
        (1, b'{"a": 1}', True), (1, b'{"a": 2}', True), (2, b'{"b": 3}', True), (2, None, False),
        (3, b'{"a": 4}', True)]
    # after the scan splits the first document off, the rest of its line is one document
    assert [d.decoded for d in got] == [None, {"a": 2}, None, None, {"a": 4}]


def test_a_releasing_decoder_gets_the_pages_of_a_mapped_document_and_may_drop_them(tmp_path):
    """``releasing``: the decoder is handed ``release``; the pages it drops are the file's, read again when
    touched (the document's bytes do not change)."""
    encoded = [json.dumps(d, separators=(",", ":")).encode() for d in DOCS]
    path = _write(tmp_path, b"\n".join(encoded) + b"\n")
    seen = []

    def decode(data, release=None):
        seen.append(release)
        release(len(data))   # every page of the document gone from memory ...
        return msgspec.json.decode(data)   # ... and read again from the file

    got = list(iter_documents(path, decode=decode, releasing=True))
    assert [d.decoded for d in got] == DOCS and [bytes(d.data) for d in got] == encoded
    assert len(seen) == len(DOCS) and all(callable(r) for r in seen)
