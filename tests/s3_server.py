"""A local S3-compatible server (moto) on 127.0.0.1, in a process of its own; prints its port.

    python tests/s3_server.py      # -> "PORT\n" on stdout, then serves until terminated

Its own process, so its request threads do not wait for the test process's
GIL (DuckDB, a Ray driver, the estimators): in one process a loaded machine
made every S3 request of a report wait behind the test's Python work.

moto 5 answers CompleteMultipartUpload with a ``CompleteMultipartUploadResponse``
root element where S3 sends ``CompleteMultipartUploadResult``; the AWS C++ SDK
inside pyarrow then reports an error, so the shim renames the element.

moto answers a ranged GET by copying the whole object out of its buffer and
slicing the copy: each of DuckDB's reads of one row group's column chunk of a
145 MB tokens file copied 145 MB, which made a 1M-row store over S3 take far
longer than the tier's budget.  :func:`ranged_gets_read_the_range` makes a
ranged GET read only its bytes (the object's buffer, under the object's lock);
every other request is moto's own.
"""

from __future__ import annotations

import logging
import sys
import threading

_RANGED = threading.local()   # set while this request thread answers a ranged GET


class _RangeReader:
    """An object's bytes, read from its buffer only where the ranged GET slices them."""

    def __init__(self, key):
        self.key = key

    def __len__(self) -> int:
        return self.key.size

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(self.key.size)
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


def ranged_gets_read_the_range() -> None:
    """Patch moto's GetObject so a request with a Range header reads only that range (see above)."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    value, get_object, handle_range = FakeKey.value, S3Response.get_object, S3Response._handle_range_header

    def lazy_value(key):
        return _RangeReader(key) if getattr(_RANGED, "on", False) else value.fget(key)

    def whole(body):
        return body.key.value if isinstance(body, _RangeReader) else body

    def ranged_get_object(self):
        _RANGED.on = bool(self.headers.get("range"))
        try:
            status, headers, body = get_object(self)
        finally:
            _RANGED.on = False
        return status, headers, body if status == 200 else whole(body)

    def ranged_handle(self, request, headers, content):
        status, headers, body = handle_range(self, request, headers, content)
        return status, headers, whole(body)   # a range it would not slice: the whole object, as moto sends it

    FakeKey.value = property(lazy_value, value.fset)
    S3Response.get_object = ranged_get_object
    S3Response._handle_range_header = ranged_handle


def shimmed_app():
    """moto's WSGI application with the CompleteMultipartUpload element renamed."""
    from moto.server import DomainDispatcherApplication, create_backend_app

    app = DomainDispatcherApplication(create_backend_app)

    def shim(environ, start_response):
        seen = {}
        body = b"".join(app(environ, lambda status, headers, exc_info=None: seen.update(s=status, h=headers)))
        headers = seen["h"]
        if b"CompleteMultipartUploadResponse" in body:
            body = body.replace(b"CompleteMultipartUploadResponse", b"CompleteMultipartUploadResult")
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"] + [("Content-Length", str(len(body)))]
        start_response(seen["s"], headers)
        return [body]

    return shim


def main() -> int:
    from werkzeug.serving import make_server

    ranged_gets_read_the_range()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = make_server("127.0.0.1", 0, shimmed_app(), threaded=True)
    print(server.server_port, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
