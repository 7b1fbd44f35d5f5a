"""On-disk conversion cache: one directory per GGUF, published atomically.

Layout: ``$MTPSERVE_CACHE_DIR/gguf/<stem>-<hash>/`` (default root ``~/.cache/mtpserve``) holding
``config.json``, the tokenizer files, ``model.safetensors`` and, written last, ``mtpserve-cache.json``
(the key and every file's size). ``<hash>`` digests the GGUF's real path, size and mtime (ns) and the
cache format version, so an edited or replaced GGUF gets a new entry. An entry is built in a temporary
sibling directory and renamed into place, so other processes see either nothing or a whole entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

CACHE_FORMAT = 1  # bump when the conversion changes, to invalidate old entries
MARKER = "mtpserve-cache.json"


def cache_root() -> Path:
    """``$MTPSERVE_CACHE_DIR`` or ``~/.cache/mtpserve``."""
    return Path(os.environ.get("MTPSERVE_CACHE_DIR") or "~/.cache/mtpserve").expanduser()


def source_key(path: str) -> dict[str, Any]:
    """What identifies a GGUF's conversion: format version, real path, size (bytes), mtime (ns)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return {"format": CACHE_FORMAT, "source": real, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def entry_dir(key: dict[str, Any]) -> Path:
    """The cache directory of a ``source_key``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    stem = Path(key["source"]).stem
    return cache_root() / "gguf" / f"{stem}-{digest}"


def is_complete(entry: Path, key: dict[str, Any]) -> bool:
    """True when ``entry`` has a marker for ``key`` and every listed file with its recorded size."""
    try:
        marker = json.loads((entry / MARKER).read_text())
        files = marker["files"]
        return marker["key"] == key and bool(files) and all(
            (entry / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_marker(folder: Path, key: dict[str, Any]) -> None:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    (folder / MARKER).write_text(json.dumps({"key": key, "files": files}, indent=1))


def _remove_stale(entry: Path) -> None:
    """Move an incomplete entry out of the way (rename first: atomic), then delete it."""
    stale = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.stale-"))
    with contextlib.suppress(FileNotFoundError):
        os.rename(entry, stale / "entry")
    shutil.rmtree(stale, ignore_errors=True)


def _publish(tmp: Path, entry: Path, key: dict[str, Any]) -> None:
    if entry.exists() and not is_complete(entry, key):
        _remove_stale(entry)
    try:
        os.rename(tmp, entry)
    except OSError:
        if not is_complete(entry, key):  # not simply lost a race to another process's build
            raise


@contextlib.contextmanager
def build_entry(key: dict[str, Any]) -> Iterator[Path]:
    """Yield an empty temporary directory to fill; on success publish it as the entry of ``key``.

    When another process published a complete entry first, that one is kept and ours deleted.
    On an exception nothing is published and the temporary directory is removed.

    Raises:
        OSError: when the cache directory cannot be created or written.
    """
    entry = entry_dir(key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}.tmp-"))
    try:
        yield tmp
        _write_marker(tmp, key)
        _publish(tmp, entry, key)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
