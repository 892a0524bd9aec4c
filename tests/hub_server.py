"""A stand-in for the Hugging Face hub's download API, serving model repositories from a
local folder (ROOT/ORG/NAME/files) on a free localhost port, for the tests that must run
without the internet (HF_ENDPOINT, or huggingface_hub.constants.ENDPOINT, pointed at it).

What a download asks, and nothing more, answered as the hub answers it:
- GET /api/models/ORG/NAME/revision/REV: the repository's commit and its files;
- GET /api/models/ORG/NAME/tree/COMMIT: the files, with their sizes and git blob ids, and
  for weight files (stored with Git LFS on the hub) their SHA-256 under "lfs";
- HEAD and GET /ORG/NAME/resolve/COMMIT/FILE: the file, its ETag (SHA-256) and the commit
  (X-Repo-Commit); 404 with X-Error-Code: EntryNotFound for a file that is not there.

`lies` makes it a hostile hub, file by file (issue 51): "more" lists the file as it is but
sends 1.5 GB after it with no length announced; "hash" sends other bytes of the same size;
"short" announces the file's size and closes the connection halfway; "loop" redirects the
download to itself; "slow headers" and "slow body" send the answer (its headers too, or its
body only) a byte every 0.2 s. `sent` counts the bytes of each body written.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
from pathlib import Path

COMMIT = "2" * 40  # every repository's one commit
TRICKLE_SECONDS = 120  # a trickling answer's end, if its client waits that long
LFS = (".safetensors", ".bin", ".pth")  # stored with Git LFS on the hub


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class _Hub(http.server.BaseHTTPRequestHandler):
    root: Path
    lies: dict[str, str]
    sent: dict[str, int]

    def log_message(self, *args) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def _answer(self, with_body: bool) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo = self.root / parts[2] / parts[3]
            files = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")
                           if p.is_file()) if repo.is_dir() else None
            if files is None:
                return self._missing("RepoNotFound")
            body = [_listed(repo, name) for name in files] if parts[4] == "tree" else \
                {"id": f"{parts[2]}/{parts[3]}", "sha": COMMIT,
                 "siblings": [{"rfilename": name} for name in files]}
            return self._send(json.dumps(body).encode(), "application/json", with_body)
        if len(parts) >= 5 and parts[2] == "resolve":
            name = "/".join(parts[4:])
            path = self.root / parts[0] / parts[1] / name
            if path.is_file():
                return self._file(name, path.read_bytes(), with_body)
        self._missing("EntryNotFound")

    def _file(self, name: str, data: bytes, with_body: bool) -> None:
        lie = self.lies.get(name)
        if lie in ("slow headers", "slow body"):
            return self._trickle(name, data, lie == "slow headers")
        if lie == "loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if lie == "hash":
            data = bytes(b ^ 0xFF for b in data)
        if lie in ("more", "short"):
            self.send_response(200)
            if lie == "short":
                self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            if with_body:
                self._write(name, data[:len(data) // 2] if lie == "short" else data)
                if lie == "more":  # 1.5 GB of zeros, unannounced, unless the client stops
                    for _ in range(1536):
                        if not self._write(name, bytes(1 << 20)):
                            break
            return
        self._send(data, "application/octet-stream", with_body, name)

    def _trickle(self, name: str, data: bytes, headers_too: bool) -> None:
        """The answer a byte every 0.2 s (its headers too, or its body only), for at most
        TRICKLE_SECONDS or until the client stops reading."""
        head = (f"HTTP/1.1 200 OK\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n").encode()
        self.close_connection = True
        if not headers_too:
            self.wfile.write(head)
            self.wfile.flush()
        for byte in [*(head if headers_too else b""), *data][:int(TRICKLE_SECONDS / 0.2)]:
            if not self._write(name, bytes([byte])):
                return
            self.wfile.flush()
            time.sleep(0.2)

    def _write(self, name: str, data: bytes) -> bool:
        try:
            self.wfile.write(data)
        except OSError:  # the client stopped reading
            return False
        self.sent[name] = self.sent.get(name, 0) + len(data)
        return True

    def _send(self, data: bytes, kind: str, with_body: bool, name: str | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if with_body:
            self._write(name or self.path, data)

    def _missing(self, code: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _listed(repo: Path, name: str) -> dict:
    data = (repo / name).read_bytes()
    entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
    if name.endswith(LFS):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "pointerSize": 134}
    return entry


class StandInHub:
    """`with StandInHub(root) as url:` serves ROOT's repositories at `url` until the end;
    `lies` (file name -> "more", "hash", "short" or "loop") makes it lie about those files."""

    def __init__(self, root: Path, lies: dict[str, str] | None = None):
        self.sent: dict[str, int] = {}
        handler = type("Hub", (_Hub,), {"root": Path(root), "lies": dict(lies or {}),
                                        "sent": self.sent})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
