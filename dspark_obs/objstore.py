"""Object-store URLs (``--out s3://bucket/prefix``): the names older code imports from here.

There is one store, :class:`dspark_obs.store.Store`, over a pyarrow filesystem; given an
object-store URL it writes and reads through ``S3FileSystem`` (or any pyarrow filesystem) with
the writer id in every file name.  This module only keeps the names callers used before the two
stores became one.
"""

from __future__ import annotations

from dspark_obs.store import Store, checked_writer_id, default_writer_id, is_url, open_store

__all__ = ["ObjectStore", "open_store", "is_url", "checked_writer_id", "default_writer_id"]

ObjectStore = Store
"""The store on an object-store URL: ``ObjectStore(url, writer_id=..., layout=...)`` is ``Store(url, ...)``."""
