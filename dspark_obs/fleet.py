"""The fleet layout: many sidecars write one run, many readers read it, nobody sees half a commit.

Collected tables (everything a sidecar writes but ``runs``) may be written as::

    <root>/<table>/run_id=<id>/date=<UTC date>/dp_rank=<r>/part-<utc>-<writer>-<8 hex>.parquet
    <root>/<table>/run_id=<id>/date=<UTC date>/part-...parquet         (tables without dp_rank)
    <root>/_manifests/run_id=<id>/<writer>-<seq>.json                   (one file per writer and run)

* **Hive partitions** by run, UTC date of the write and DP rank: DuckDB, Ray
  Data, Spark or Trino prune by path without opening files.  ``dp_rank`` is
  also a column of the files (any engine reads it without the path).
* **Clustered by request**, as every part file of the store
  (:mod:`dspark_obs.clustering`; ``step_reqs`` keep their batch order as ``batch_index``).
* **Manifest of committed files**: a data file is visible only once a manifest
  lists it.  Each writer keeps one cumulative manifest per run, replaced by a
  newer one (``<writer>-<seq>.json``, sequence zero-padded so names sort; written
  whole — a rename locally, one PUT on an object store — then the older one is
  deleted).  Readers take each writer's newest manifest and union their files.
  A sidecar that dies between a data file and its manifest leaves that file
  invisible: nothing half-visible, ever.
* **Old layout still read**: part files directly under ``run_id=<id>/`` (no
  manifest) are read as before; a store may hold both.

This module works on any pyarrow filesystem (local or object store) given the
store's base path.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import secrets
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dspark_obs.clustering import cluster_by_request, write_options

__all__ = ["LAYOUTS", "FLEET_TABLES", "MANIFEST_DIR", "FleetWriter", "committed_files", "manifest_fingerprint",
           "forget_table"]

LAYOUTS = ("flat", "fleet")
FLEET_TABLES = ("steps", "step_reqs", "requests", "tokens", "gaps", "dead_letters", "estimator_records")
"""What a sidecar writes in the fleet layout; ``runs`` (one row per run) and result tables stay flat."""
MANIFEST_DIR = "_manifests"
_TS_FORMAT = "%Y%m%dT%H%M%S%fZ"
_MANIFEST_RE = re.compile(r"(?P<writer>[A-Za-z0-9_.]+)-(?P<seq>\d{12})\.json")


def _split_by_rank(data: pa.Table) -> list[tuple[int | None, pa.Table]]:
    if "dp_rank" not in data.column_names:
        return [(None, data)]
    ranks = pc.fill_null(data.column("dp_rank"), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return [(int(r), data.filter(pa.array(ranks == r))) for r in np.unique(ranks)]


@dataclass
class FleetWriter:
    """One writer's side of the layout: data files, then its manifest (see the module docstring)."""

    fs: pafs.FileSystem
    base: str                  # the store's root path on ``fs``
    writer_id: str
    atomic_rename: bool        # local: write the manifest under a temporary name and rename it

    def __post_init__(self) -> None:
        self._files: dict[str, list[dict]] = {}   # run -> committed entries of this writer
        self._seq: dict[str, int] = {}

    def write(self, table: str, run_id: str, data: pa.Table, now: _dt.datetime | None = None) -> list[str]:
        """Write ``data`` (already conformed) as clustered files per DP rank and commit them; their paths."""
        now = now or _dt.datetime.now(_dt.timezone.utc)
        date = now.strftime("%Y-%m-%d")
        entries = []
        for rank, part in _split_by_rank(data):
            rel = f"{table}/run_id={run_id}/date={date}" + ("" if rank is None else f"/dp_rank={rank}")
            name = f"part-{now.strftime(_TS_FORMAT)}-{self.writer_id}-{secrets.token_hex(4)}.parquet"
            self.fs.create_dir(f"{self.base}/{rel}", recursive=True)
            clustered = cluster_by_request(part, table)
            with self.fs.open_output_stream(f"{self.base}/{rel}/{name}") as f:
                pq.write_table(clustered, f, **write_options(clustered))
            entries.append({"table": table, "path": f"{rel}/{name}", "rows": part.num_rows})
        self._commit(run_id, entries)
        return [f"{self.base}/{e['path']}" for e in entries]

    def _commit(self, run_id: str, entries: list[dict]) -> None:
        if run_id not in self._files:
            self._files[run_id], self._seq[run_id] = self._load_own(run_id)
        self._files[run_id] += entries
        self._seq[run_id] += 1
        folder = f"{self.base}/{MANIFEST_DIR}/run_id={run_id}"
        name = f"{self.writer_id}-{self._seq[run_id]:012d}.json"
        body = json.dumps({"version": 1, "run_id": run_id, "writer": self.writer_id, "seq": self._seq[run_id],
                           "committed_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                           "files": self._files[run_id]}).encode()
        self.fs.create_dir(folder, recursive=True)
        target = f"{folder}/{name}"
        if self.atomic_rename:
            tmp = f"{folder}/.{name}.tmp"
            with self.fs.open_output_stream(tmp) as f:
                f.write(body)
            self.fs.move(tmp, target)
        else:
            with self.fs.open_output_stream(target) as f:  # an object appears whole when its upload completes
                f.write(body)
        for old in _manifests(self.fs, folder):
            if old[0] == self.writer_id and old[1] < self._seq[run_id]:
                try:
                    self.fs.delete_file(f"{folder}/{old[2]}")
                except (FileNotFoundError, OSError):
                    pass

    def _load_own(self, run_id: str) -> tuple[list[dict], int]:
        """This writer's committed entries of ``run_id`` so far (a resumed writer goes on from them)."""
        folder = f"{self.base}/{MANIFEST_DIR}/run_id={run_id}"
        mine = [m for m in _manifests(self.fs, folder) if m[0] == self.writer_id]
        if not mine:
            return [], 0
        writer, seq, name = max(mine)
        return list(_read_manifest(self.fs, f"{folder}/{name}").get("files", [])), seq


def _manifests(fs: pafs.FileSystem, folder: str) -> list[tuple[str, int, str]]:
    """``(writer, seq, name)`` of the manifests in ``folder``."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    except (FileNotFoundError, OSError):
        return []
    out = []
    for info in infos:
        m = _MANIFEST_RE.fullmatch(info.base_name)
        if m and info.type == pafs.FileType.File:
            out.append((m["writer"], int(m["seq"]), info.base_name))
    return out


def _read_manifest(fs: pafs.FileSystem, path: str) -> dict:
    try:
        with fs.open_input_stream(path) as f:
            return json.loads(f.read())
    except (FileNotFoundError, OSError, ValueError):  # replaced meanwhile: the caller lists again
        return {}


def _newest(fs: pafs.FileSystem, base: str, run_id: str | None) -> list[tuple[str, str]]:
    """``(run folder, manifest name)`` of each writer's newest manifest (of one run, or all)."""
    root = f"{base}/{MANIFEST_DIR}"
    if run_id is None:
        try:
            infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        except (FileNotFoundError, OSError):
            return []
        folders = [i.path for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith("run_id=")]
    else:
        folders = [f"{root}/run_id={run_id}"]
    out = []
    for folder in sorted(folders):
        newest: dict[str, tuple[int, str]] = {}
        for writer, seq, name in _manifests(fs, folder):
            if writer not in newest or seq > newest[writer][0]:
                newest[writer] = (seq, name)
        out += [(folder, name) for _, name in sorted(newest.values(), key=lambda v: v[1])]
    return out


def committed_files(fs: pafs.FileSystem, base: str, *, table: str | None = None,
                    run_id: str | None = None) -> list[str]:
    """Paths (on ``fs``) of the fleet-layout files the newest manifests list, sorted."""
    files = set()
    for folder, name in _newest(fs, base, run_id):
        for entry in _read_manifest(fs, f"{folder}/{name}").get("files", []):
            if table is None or entry.get("table") == table:
                files.add(f"{base}/{entry['path']}")
    return sorted(files)


def manifest_fingerprint(fs: pafs.FileSystem, base: str) -> str:
    """Changes whenever a writer commits (the names of the newest manifests): cheap, for view caches."""
    return "|".join(f"{folder.rsplit('/', 1)[-1]}/{name}" for folder, name in _newest(fs, base, None))


def forget_table(fs: pafs.FileSystem, base: str, table: str, run_id: str) -> int:
    """Delete ``table``'s fleet files of ``run_id`` and rewrite every manifest of the run without them.

    For re-collecting a run under the same id with its writers stopped (a live
    writer would add its entries back at its next commit).
    """
    removed = 0
    for folder, name in _newest(fs, base, run_id):
        path = f"{folder}/{name}"
        manifest = _read_manifest(fs, path)
        keep = [e for e in manifest.get("files", []) if e.get("table") != table]
        for entry in manifest.get("files", []):
            if entry.get("table") == table:
                try:
                    fs.delete_file(f"{base}/{entry['path']}")
                    removed += 1
                except (FileNotFoundError, OSError):
                    pass
        if len(keep) != len(manifest.get("files", [])):
            with fs.open_output_stream(path) as f:
                f.write(json.dumps({**manifest, "files": keep}).encode())
    return removed
