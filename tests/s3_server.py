"""A local S3-compatible server (moto) on 127.0.0.1, in a process of its own; prints its port.

    python tests/s3_server.py      # -> "PORT\n" on stdout, then serves until terminated

Its own process, so its request threads do not wait for the test process's
GIL (DuckDB, a Ray driver, the estimators): in one process a loaded machine
made every S3 request of a report wait behind the test's Python work.

moto 5 answers CompleteMultipartUpload with a ``CompleteMultipartUploadResponse``
root element where S3 sends ``CompleteMultipartUploadResult``; the AWS C++ SDK
inside pyarrow then reports an error, so the shim renames the element.
"""

from __future__ import annotations

import logging
import sys


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

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = make_server("127.0.0.1", 0, shimmed_app(), threaded=True)
    print(server.server_port, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
