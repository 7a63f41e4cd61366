"""Where a lake's files live: a local folder or an s3:// bucket, with one set of storage options for every call.

A lake's Delta tables are read and written by delta-rs and Polars straight from the lake root. Everything else
a lake holds is whole files: checkpoint folders, run configs (runs/<run id>.toml) and reports. `LakeFiles`
handles those. On a local lake they are plain files under the root. On s3:// they are objects, put and got by
obstore, with a local cache for the folders a model is loaded from, because transformers reads a folder on disk.

    <cache>/lakes/<bucket>/<prefix>/checkpoints/<kind>/v<version>   a checkpoint written here, then uploaded,
                                                                  or downloaded here to be loaded
    <cache>/lakes/<bucket>/<prefix>/reports/<run id>               a report drawn here, then uploaded

`<cache>` is $GENENV_CACHE, or ~/.cache/genenv by default.

The storage options come from the environment: AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and AWS_ALLOW_HTTP. delta-rs would read them from there itself. They
are still passed explicitly to every delta-rs, Polars and obstore call, so all three are sure to reach the same
endpoint with the same credentials. Workers inherit the environment of the run that starts them.

Why obstore and not fsspec/s3fs: obstore binds the same Rust object_store crate that delta-rs and Polars use,
so the option names mean the same thing to all three. It also has conditional puts without boto, which gives a
run config that is written once, by whichever writer comes first.

Invariants:
- A checkpoint folder's weights are uploaded after every other file in it. Each object PUT is atomic, so a
  folder whose weights can be read is whole. The registry's sha256 check reads the weights, so it never passes
  on a partial upload.
- A cached folder is used only when its weights have the sha256 the caller expects; otherwise it is fetched
  again. So a stale cache (another lake under the same bucket path, say) can cost a download, never a wrong
  model.
- The cache is shared by every process on the machine: a folder is checked and replaced under its lock, and
  the cache's checkpoints are bounded by $GENENV_CACHE_GB (lake/cache.py).
- Only s3:// is supported as a remote scheme. Any other scheme stops before any work, with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import obstore
from obstore.exceptions import AlreadyExistsError
from obstore.store import from_url

from .cache import evict, locked, mark_used

REMOTE_SCHEMES = ("s3",)
OPTION_NAMES = (
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ALLOW_HTTP",
)
CHUNK = 8 << 20  # bytes per write when a file is downloaded
WEIGHT_SUFFIXES = (".safetensors", "weights.sha256")  # uploaded last (see the invariants)


class StorageError(RuntimeError):
    """The object store refused, or a lake root names a scheme genenv does not support."""


def storage_options(environ=None) -> dict[str, str]:
    """The lake's storage options, read from the environment (only the names in OPTION_NAMES that are set)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in OPTION_NAMES if environ.get(name)}


def check_remote_root(root: str) -> None:
    """StorageError (one line) for a remote lake root genenv cannot use."""
    scheme, _, rest = root.partition("://")
    if scheme not in REMOTE_SCHEMES:
        raise StorageError(f"lake {root}: {scheme}:// is not supported (a local path or s3://bucket/prefix)")
    if not rest.split("/", 1)[0]:
        raise StorageError(f"lake {root}: no bucket named (s3://bucket/prefix)")


def cache_root() -> Path:
    return Path(os.environ.get("GENENV_CACHE") or Path.home() / ".cache" / "genenv")


ANSI = re.compile(r"\x1b\[[0-9;]*m")
S3_ERROR = re.compile(r"<Code>(.*?)</Code>(?:<Message>(.*?)</Message>)?")


def first_line(exc: BaseException) -> str:
    """The line of a storage error that says what went wrong. object_store writes a chain of causes, one per line
    (marked with ↳), most general first: the S3 error code when the server sent one, else the deepest cause."""
    text = ANSI.sub("", str(exc))
    if code := S3_ERROR.search(text):
        return f"{code[1]}: {code[2]}" if code[2] else code[1]
    lines = [line.strip(" ↳") for line in text.splitlines() if line.strip(" ↳")]
    if not lines:
        return exc.__class__.__name__
    return (lines[-1] if "↳" in text else lines[0])[:200]


class LakeFiles:
    """The lake's whole files (everything but its Delta tables), addressed by their path relative to the root."""

    def __init__(self, root: str, options: dict[str, str]):
        self.root = root
        self.remote = "://" in root
        self._store = None
        if self.remote:
            check_remote_root(root)
            config = {name.lower(): value for name, value in options.items() if name != "AWS_ALLOW_HTTP"}
            client = {"allow_http": options.get("AWS_ALLOW_HTTP", "").lower() == "true"}
            self._store = from_url(root, config=config, client_options=client)

    def local(self, relative: str) -> Path:
        """Where `relative` lives on this machine: under a local lake's root, or in the cache of a remote one."""
        if not self.remote:
            return Path(self.root) / relative
        return cache_root() / "lakes" / self.root.split("://", 1)[1] / relative

    # Small files (run configs): read, written once.

    def read_text(self, relative: str) -> str | None:
        """The file's text, or None when the lake has no such file."""
        if not self.remote:
            path = self.local(relative)
            return path.read_text() if path.is_file() else None
        try:
            return bytes(obstore.get(self._store, relative).bytes()).decode()
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 (obstore's errors: whatever the store said, in one line)
            raise StorageError(f"cannot read {self.root}/{relative}: {first_line(exc)}") from None

    def write_text_once(self, relative: str, text: str) -> None:
        """Write the file unless it exists (the first writer wins; later ones leave it as it is)."""
        if not self.remote:
            path = self.local(relative)
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
                partial.write_text(text)
                partial.replace(path)
            return
        try:
            obstore.put(self._store, relative, text.encode(), mode="create")
        except AlreadyExistsError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot write {self.root}/{relative}: {first_line(exc)}") from None

    def claim(self, relative: str, text: str) -> bool:
        """Create the file holding `text` if no one has: True for the one caller that did, False for every other
        (an exclusive create on a local lake, a conditional put, If-None-Match, on a store)."""
        if not self.remote:
            path = self.local(relative)
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(path, "x") as out:
                    out.write(text)
            except FileExistsError:
                return False
            return True
        try:
            obstore.put(self._store, relative, text.encode(), mode="create")
        except AlreadyExistsError:
            return False
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot write {self.root}/{relative}: {first_line(exc)}") from None
        return True

    def check_writable(self) -> None:
        """StorageError (one line) unless files can be written and deleted under the root (checked before any
        training, so a read-only bucket stops a run before its first checkpoint is lost)."""
        if not self.remote:
            return
        probe = f"_probe/{uuid.uuid4().hex}"
        try:
            obstore.put(self._store, probe, b"genenv")
            obstore.delete(self._store, probe)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"lake {self.root} is not writable: {first_line(exc)}") from None

    # Folders (checkpoints, reports): written locally, uploaded; fetched to be read.

    def upload_folder(self, relative: str) -> None:
        """Put every file of local(relative) under `relative` in the store, weights last (nothing on a local lake)."""
        if not self.remote:
            return
        folder = self.local(relative)
        files = sorted(
            (p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name.endswith(WEIGHT_SUFFIXES), str(p))
        )
        try:
            for path in files:
                obstore.put(self._store, f"{relative}/{path.relative_to(folder).as_posix()}", path)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot upload {folder} to {self.root}/{relative}: {first_line(exc)}") from None

    def fetch_folder(self, relative: str, is_current=None) -> Path:
        """local(relative), holding the store's files under `relative`: downloaded unless the cached copy passes
        `is_current(folder)`. On a local lake the folder itself. A folder the store lacks is absent afterwards."""
        folder = self.local(relative)
        if not self.remote:
            return folder
        with locked(folder):  # one process at a time checks, replaces or evicts a cached folder (lake/cache.py)
            if not (folder.is_dir() and is_current is not None and is_current(folder)):
                self._download(relative, folder)
            if folder.is_dir():
                mark_used(folder)
        if "/checkpoints/" in f"/{relative}":
            evict(cache_root() / "lakes", keep=folder)
        return folder

    def _download(self, relative: str, folder: Path) -> None:
        partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            for batch in obstore.list(self._store, prefix=f"{relative}/"):
                for item in batch:
                    target = partial / item["path"][len(relative) + 1 :]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with open(target, "wb") as out:  # streamed: a weights shard is gigabytes
                        for chunk in obstore.get(self._store, item["path"]).stream(min_chunk_size=CHUNK):
                            out.write(chunk)
        except Exception as exc:  # noqa: BLE001
            shutil.rmtree(partial, ignore_errors=True)
            raise StorageError(f"cannot download {self.root}/{relative}: {first_line(exc)}") from None
        shutil.rmtree(folder, ignore_errors=True)
        if partial.is_dir():
            partial.rename(folder)

    def folders(self, relative: str) -> list[str]:
        """The names of the folders directly under `relative`."""
        if not self.remote:
            folder = self.local(relative)
            return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
        try:
            listing = self._store.list_with_delimiter(f"{relative}/")
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot list {self.root}/{relative}: {first_line(exc)}") from None
        return sorted(prefix.rstrip("/").rsplit("/", 1)[-1] for prefix in listing["common_prefixes"])

    def remove_folder(self, relative: str) -> None:
        """Delete `relative` and everything under it (from the store and the cache, on a remote lake)."""
        shutil.rmtree(self.local(relative), ignore_errors=True)
        if not self.remote:
            return
        try:
            paths = [item["path"] for batch in obstore.list(self._store, prefix=f"{relative}/") for item in batch]
            if paths:
                obstore.delete(self._store, paths)
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot delete {self.root}/{relative}: {first_line(exc)}") from None
