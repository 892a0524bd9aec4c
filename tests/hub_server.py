"""A stand-in for the Hugging Face hub's download API, serving model repositories from a
local folder (ROOT/ORG/NAME/files) on a free localhost port, for the tests that must run
without the internet (HF_ENDPOINT, or huggingface_hub.constants.ENDPOINT, pointed at it).

What huggingface_hub's snapshot_download and hf_hub_download ask, and nothing more:
- GET /api/models/ORG/NAME/revision/REV: the repository's commit and its files;
- GET /api/models/ORG/NAME/tree/COMMIT: the files, with their sizes;
- HEAD and GET /ORG/NAME/resolve/COMMIT/FILE: the file, its ETag (SHA-256) and the commit
  (X-Repo-Commit); 404 with X-Error-Code: EntryNotFound for a file that is not there.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

COMMIT = "2" * 40  # every repository's one commit


class _Hub(http.server.BaseHTTPRequestHandler):
    root: Path

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
            body = [{"type": "file", "path": name, "size": (repo / name).stat().st_size,
                     "oid": "0" * 40} for name in files] if parts[4] == "tree" else \
                {"id": f"{parts[2]}/{parts[3]}", "sha": COMMIT,
                 "siblings": [{"rfilename": name} for name in files]}
            return self._send(json.dumps(body).encode(), "application/json", with_body)
        if len(parts) >= 5 and parts[2] == "resolve":
            path = self.root / parts[0] / parts[1] / "/".join(parts[4:])
            if path.is_file():
                return self._send(path.read_bytes(), "application/octet-stream", with_body)
        self._missing("EntryNotFound")

    def _send(self, data: bytes, kind: str, with_body: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", COMMIT)
        self.end_headers()
        if with_body:
            self.wfile.write(data)

    def _missing(self, code: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()


class StandInHub:
    """`with StandInHub(root) as url:` serves ROOT's repositories at `url` until the end."""

    def __init__(self, root: Path):
        handler = type("Hub", (_Hub,), {"root": Path(root)})
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
