"""`hpctrain prefetch`'s downloads, checked while they stream, kept only when whole.

torch.hub's `download_url_to_file` checks a hash only when the file's name carries one, and
huggingface_hub's downloads check neither the hub's hash (ETag: the file's SHA-256, or its git
blob id) nor the announced size until the whole body is on disk: a server that lists 100
bytes and sends 1.5 GB fills the cache, a file of the wrong hash is kept, and a redirect loop
or a body cut short is a traceback. Here each file is streamed into a fresh partial file
beside its place and checked as it comes: a body announcing more than the listing promised
is refused before it is read, the download stops at the first byte past the promise, a body
shorter than its promise is refused, the hash is compared at the end; only then is the file
renamed into place. Every request goes through hpctrain's one HTTP client (network.py): a
server slower than the minimum rate, its headers or its body, is stopped. Whatever fails
leaves nothing behind and is one line (FetchFailed, exit 1).

The Hugging Face cache is written as huggingface_hub lays it out and reads it
(`models--ORG--NAME/blobs/<hash>`, `snapshots/<commit>/<file>` linking to its blob,
`refs/main` naming the commit), so timm and transformers find the files offline; the
listing (which files, their sizes and hashes, the commit) is the hub's API, read through the
same client and checked (a path that would leave the snapshot is refused).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpctrain import network
from hpctrain.errors import FetchFailed
from hpctrain.network import Patience
from hpctrain.readers import COUNT, parse_json
from hpctrain.writers import fresh_file, own_folder, write_whole

MOST_BYTES = 1 << 40  # where nothing promises a size: no weight file is a terabyte
LISTING_BYTES = 64 << 20  # a repository's listing: some hundred bytes a file
MOST_PAGES = 1000  # of a listing (the hub's pages hold a thousand files each)


@dataclass(frozen=True)
class Promise:
    """What a file must be: its size (None: the server's Content-Length, at most MOST_BYTES)
    and its hash: `algorithm` (sha256, or git for a git blob id) and the hex digest, or the
    leading part of one (torch.hub names its files by a SHA-256 prefix)."""

    size: int | None = None
    algorithm: str | None = None
    digest: str | None = None


def fetch(url: str, place: Path, promise: Promise, headers: dict | None = None,
          patience: Patience = Patience()) -> Path:
    """`url` into `place` (its folder made), checked against `promise` as it streams, at the
    pace `patience` allows (network.py)."""
    own_folder(place.parent)
    descriptor, partial = fresh_file(place)
    try:  # uncompressed: a compressed body could expand past the promise in one piece
        with os.fdopen(descriptor, "wb") as out, network.get(
                url, {**(headers or {}), "Accept-Encoding": "identity"}, patience) as response:
            if response.status != 200:
                raise FetchFailed(f"{url}: the server answered {response.status}")
            hashed = _receive(response, out, promise, url)
        _check_hash(hashed, promise, url)
        os.replace(partial, place)
        return place
    except network.errors() as err:
        raise FetchFailed(f"{url}: {type(err).__name__}: {str(err)[:200]}; nothing kept") \
            from None
    finally:
        partial.unlink(missing_ok=True)


def fetch_json(url: str, headers: dict, patience: Patience):
    """The JSON value at `url` (a listing), at most LISTING_BYTES, and the response's headers
    (a next page's link)."""
    try:
        with network.get(url, {**headers, "Accept-Encoding": "identity"}, patience) as response:
            if response.status != 200:
                raise FetchFailed(f"{url}: the server answered {response.status}")
            body = io.BytesIO()
            _receive(response, body, Promise(), url, most_bytes=LISTING_BYTES)
        return parse_json(body.getvalue()), response.headers
    except network.errors() as err:
        raise FetchFailed(f"{url}: {type(err).__name__}: {str(err)[:200]}") from None
    except ValueError as err:  # not JSON, nested too deep (readers.Unreadable)
        raise FetchFailed(f"{url}: its listing is not JSON that can be read ({err})"[:300]) \
            from None


def _receive(response, out, promise: Promise, url: str, most_bytes: int = MOST_BYTES):
    """The body into `out`, counted against the promise (where none: what the server
    announces, at most `most_bytes`) as it comes; its running hash."""
    announced = response.headers.get("content-length")
    encoded = response.headers.get("content-encoding", "identity") != "identity"
    announced = int(announced) if announced and announced.isdigit() and not encoded else None
    most = promise.size if promise.size is not None else \
        announced if announced is not None and announced <= most_bytes else most_bytes
    if announced is not None and announced > most:
        raise FetchFailed(f"{url}: the server announces {announced:,} bytes where "
                          f"{most:,} were promised; nothing kept")
    hashed = _hasher(promise)
    received = 0
    for chunk in response.chunks():
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


HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a commit or git blob id; a SHA-256
NEXT_PAGE = re.compile(r'<([^>]+)>;\s*rel="next"')


@dataclass(frozen=True)
class Listed:
    """A file of a hub repository as its listing names it, checked: a relative path that
    stays inside the snapshot, and the size and hash its download must have."""

    path: str
    promise: Promise


def hub_files(repo: str, cache: str, endpoint: str, patterns: list[str] | None = None,
              patience: Patience = Patience()) -> Path:
    """The files of hub repository `repo` (those matching `patterns`, else all) at its main
    revision into the Hugging Face cache `cache`; the snapshot folder. The listing is the
    hub's API (what huggingface_hub's model_info and list_repo_tree read), through the same
    paced client as the files."""
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()
    commit = _commit(f"{endpoint}/api/models/{repo}/revision/main", headers, patience)
    files = [f for f in _tree(f"{endpoint}/api/models/{repo}/tree/{commit}?recursive=true",
                              headers, patience)
             if patterns is None or any(fnmatch.fnmatch(f.path, p) for p in patterns)]
    if not files:
        raise FetchFailed(f"{endpoint}: {repo} lists no files to fetch")
    folder = Path(cache) / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    for listed in files:
        blob = folder / "blobs" / listed.promise.digest
        if not blob.is_file():
            fetch(f"{endpoint}/{repo}/resolve/{commit}/{listed.path}", blob, listed.promise,
                  headers, patience)
        _link(snapshot / listed.path, blob)
    own_folder(folder / "refs")
    write_whole(folder / "refs" / "main", commit)
    return snapshot


def _commit(url: str, headers: dict, patience: Patience) -> str:
    info, _ = fetch_json(url, headers, patience)
    commit = info.get("sha") if isinstance(info, dict) else None
    if not (isinstance(commit, str) and HEX.fullmatch(commit)):
        raise FetchFailed(f"{url}: the hub names no commit of the repository (its answer "
                          f"holds {str(commit)[:60]!r})")
    return commit


def _tree(url: str, headers: dict, patience: Patience) -> list[Listed]:
    """Every file of the listing, its pages followed (the hub's Link header)."""
    found, pages = [], 0
    while url:
        entries, answered = fetch_json(url, headers, patience)
        if not isinstance(entries, list):
            raise FetchFailed(f"{url}: the hub's listing is not a list of files")
        found += [_listed(entry, url) for entry in entries
                  if isinstance(entry, dict) and entry.get("type") == "file"]
        following = NEXT_PAGE.search(answered.get("link", ""))
        url, pages = (following.group(1) if following else None), pages + 1
        if pages > MOST_PAGES:
            raise FetchFailed(f"{url}: more than {MOST_PAGES} pages of files")
    return found


def _listed(entry: dict, url: str) -> Listed:
    """A listing's entry checked: a file's path may not leave the snapshot (an absolute path,
    a '..'), and its size and hashes are what a download is held to."""
    path, lfs = entry.get("path"), entry.get("lfs")
    parts = str(path).split("/")
    whole = COUNT.holds(entry.get("size")) and isinstance(entry.get("oid"), str) and \
        HEX.fullmatch(entry["oid"]) is not None
    if lfs is not None:
        whole = whole and isinstance(lfs, dict) and COUNT.holds(lfs.get("size")) and \
            isinstance(lfs.get("oid"), str) and len(lfs["oid"]) == 64 and \
            HEX.fullmatch(lfs["oid"]) is not None
    if not isinstance(path, str) or not path or path.startswith("/") or \
            any(part in ("", ".", "..") for part in parts) or not whole:
        raise FetchFailed(f"{url}: the hub lists a file it cannot be ({str(path)[:80]!r}: a "
                          "path inside the repository, its size and hashes); nothing fetched")
    promise = Promise(lfs["size"], "sha256", lfs["oid"]) if lfs else \
        Promise(entry["size"], "git", entry["oid"])
    return Listed(path, promise)


def _link(name: Path, blob: Path) -> None:
    """The snapshot's name for a file, a relative link to its blob (as huggingface_hub)."""
    own_folder(name.parent)
    target = os.path.relpath(blob, name.parent)
    if name.is_symlink() and os.readlink(name) == target:
        return
    name.unlink(missing_ok=True)
    name.symlink_to(target)
