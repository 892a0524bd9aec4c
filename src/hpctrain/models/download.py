"""`hpctrain prefetch`'s downloads, checked while they stream, kept only when whole.

torch.hub's `download_url_to_file` checks a hash only when the file's name carries one, and
huggingface_hub's downloads check neither the hub's hash (ETag: the file's SHA-256, or its git
blob id) nor the announced size until the whole body is on disk: a server that lists 100
bytes and sends 1.5 GB fills the cache, a file of the wrong hash is kept, and a redirect loop
or a body cut short is a traceback. Here each file is streamed into a fresh partial file
beside its place and checked as it comes: a body announcing more than the listing promised
is refused before it is read, the download stops at the first byte past the promise, a body
shorter than its promise is refused, the hash is compared at the end; only then is the file
renamed into place. Whatever fails leaves nothing behind and is one line (FetchFailed,
exit 1).

The Hugging Face cache is written as huggingface_hub lays it out and reads it
(`models--ORG--NAME/blobs/<hash>`, `snapshots/<commit>/<file>` linking to its blob,
`refs/main` naming the commit), so timm and transformers find the files offline; the
listing (which files, their sizes and hashes, the commit) comes from huggingface_hub's API.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import FetchFailed
from hpctrain.writers import fresh_file, own_folder, write_whole

MAX_REDIRECTS = 5
CHUNK = 1 << 20
MOST_BYTES = 1 << 40  # where nothing promises a size: no weight file is a terabyte


@dataclass(frozen=True)
class Promise:
    """What a file must be: its size (None: the server's Content-Length, at most MOST_BYTES)
    and its hash: `algorithm` (sha256, or git for a git blob id) and the hex digest, or the
    leading part of one (torch.hub names its files by a SHA-256 prefix)."""

    size: int | None = None
    algorithm: str | None = None
    digest: str | None = None


def fetch(url: str, place: Path, promise: Promise, headers: dict | None = None) -> Path:
    """`url` into `place` (its folder made), checked against `promise` as it streams."""
    import httpx

    own_folder(place.parent)
    descriptor, partial = fresh_file(place)
    try:  # uncompressed: a compressed body could expand past the promise in one piece
        with os.fdopen(descriptor, "wb") as out, httpx.Client(
                follow_redirects=True, max_redirects=MAX_REDIRECTS,
                headers={**(headers or {}), "Accept-Encoding": "identity"},
                timeout=httpx.Timeout(60.0, connect=20.0)) as client, \
                client.stream("GET", url) as response:
            if response.status_code != 200:
                raise FetchFailed(f"{url}: the server answered {response.status_code} "
                                  f"{response.reason_phrase}")
            hashed = _receive(response, out, promise, url)
        _check_hash(hashed, promise, url)
        os.replace(partial, place)
        return place
    except httpx.HTTPError as err:
        raise FetchFailed(f"{url}: {type(err).__name__}: {str(err)[:200]}; nothing kept") \
            from None
    finally:
        partial.unlink(missing_ok=True)


def _receive(response, out, promise: Promise, url: str):
    """The body into `out`, counted against the promise as it comes; its running hash."""
    announced = response.headers.get("Content-Length")
    encoded = response.headers.get("Content-Encoding", "identity") != "identity"
    announced = int(announced) if announced and announced.isdigit() and not encoded else None
    most = promise.size if promise.size is not None else \
        announced if announced is not None else MOST_BYTES
    if announced is not None and announced > most:
        raise FetchFailed(f"{url}: the server announces {announced:,} bytes where "
                          f"{most:,} were promised; nothing kept")
    hashed = _hasher(promise)
    received = 0
    for chunk in response.iter_bytes(CHUNK):
        received += len(chunk)
        if received > most:
            raise FetchFailed(f"{url}: the server sent more than the {most:,} bytes "
                              "promised; stopped, nothing kept")
        out.write(chunk)
        if hashed is not None:
            hashed.update(chunk)
    expected = promise.size if promise.size is not None else announced
    if expected is not None and received != expected:
        raise FetchFailed(f"{url}: {received:,} bytes arrived of the {expected:,} promised "
                          "(cut short); nothing kept")
    return hashed


def _hasher(promise: Promise):
    if promise.algorithm == "sha256":
        return hashlib.sha256()
    if promise.algorithm == "git":  # git's blob id: sha1 over a header and the bytes
        hashed = hashlib.sha1()
        hashed.update(f"blob {promise.size}\0".encode())
        return hashed
    return None


def _check_hash(hashed, promise: Promise, url: str) -> None:
    if hashed is not None and not hashed.hexdigest().startswith(promise.digest.lower()):
        raise FetchFailed(f"{url}: the file's {promise.algorithm} hash is "
                          f"{hashed.hexdigest()[:16]}..., not the {promise.digest[:16]}... "
                          "the source promised; nothing kept")


# ---- the Hugging Face hub, into its cache


def hub_files(repo: str, cache: str, endpoint: str, patterns: list[str] | None = None) -> Path:
    """The files of hub repository `repo` (those matching `patterns`, else all) at its main
    revision into the Hugging Face cache `cache`; the snapshot folder."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import build_hf_headers

    api = HfApi(endpoint=endpoint)
    try:
        commit = api.model_info(repo, revision="main").sha
        files = [f for f in api.list_repo_tree(repo, revision=commit, recursive=True)
                 if hasattr(f, "blob_id") and (patterns is None or any(
                     fnmatch.fnmatch(f.path, p) for p in patterns))]
    except Exception as err:  # the library's own errors (HTTP, a repository not found)
        raise FetchFailed(f"{endpoint}: cannot list {repo} ({type(err).__name__}: "
                          f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    if not commit or not files:
        raise FetchFailed(f"{endpoint}: {repo} lists no files to fetch")
    folder = Path(cache) / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    headers = build_hf_headers()
    for listed in files:
        promise = Promise(listed.lfs.size, "sha256", listed.lfs.sha256) if listed.lfs else \
            Promise(listed.size, "git", listed.blob_id)
        blob = folder / "blobs" / promise.digest
        if not blob.is_file():
            fetch(f"{endpoint}/{repo}/resolve/{commit}/{listed.path}", blob, promise, headers)
        _link(snapshot / listed.path, blob)
    own_folder(folder / "refs")
    write_whole(folder / "refs" / "main", commit)
    return snapshot


def _link(name: Path, blob: Path) -> None:
    """The snapshot's name for a file, a relative link to its blob (as huggingface_hub)."""
    own_folder(name.parent)
    target = os.path.relpath(blob, name.parent)
    if name.is_symlink() and os.readlink(name) == target:
        return
    name.unlink(missing_ok=True)
    name.symlink_to(target)
