#!/usr/bin/env python3
"""Minimal stand-in for the Hugging Face Hub download routes, for integration tests.

Serves one model repo from a local directory. Standard library only (Python 3.11).
Prints `PORT <n>` on stdout once listening, then serves until killed.
See --help for the fault-injection switches (--cut, --corrupt, --redirect, --token).
"""
import argparse
import hashlib
import json
import os
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")
MODEL_RE = re.compile(r"^/api/models/([^/]+)/([^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
RESOLVE_RE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
CDN_RE = re.compile(r"^/cdn/([0-9a-f]{64})$")


class Entry:
    """One repo file, with the hashes the Hub would advertise for it."""

    def __init__(self, path, data, corrupt):
        self.path, self.data, self.size = path, data, len(data)
        self.lfs = path.endswith(LFS_SUFFIXES)
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.blob_sha1 = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        self.etag = self.sha256 if self.lfs else self.blob_sha1
        # --corrupt: bytes on the wire differ, advertised hashes/sizes don't.
        self.body = data
        if corrupt and data:
            b = bytearray(data)
            b[len(b) // 2] ^= 0xFF
            self.body = bytes(b)

    def tree_item(self):
        """Entry of GET /api/models/.../tree: git oid is the pointer's blob for LFS files."""
        item = {"type": "file", "path": self.path, "size": self.size, "oid": self.blob_sha1}
        if self.lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
            item["oid"] = hashlib.sha1(b"blob %d\0%s" % (len(pointer), pointer.encode())).hexdigest()
            item["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": len(pointer)}
        return item


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response carries Content-Length
    cfg = None  # argparse namespace, set in main()
    files = {}  # path -> Entry
    cut_lock = threading.Lock()  # guards the one-shot --cut
    log_lock = threading.Lock()

    def log_message(self, *args):  # silence default stderr access log
        pass

    def send_response(self, code, message=None):
        self._status = code  # remembered for --log
        super().send_response(code, message)

    def do_HEAD(self):
        self.handle_any(head=True)

    def do_GET(self):
        self.handle_any(head=False)

    # --- plumbing -----------------------------------------------------------
    def handle_any(self, head):
        self._status = None
        try:
            self.route(head)
        finally:
            if self.cfg.log:
                line = {"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                        "auth": self.headers.get("Authorization"), "status": self._status}
                with self.log_lock, open(self.cfg.log, "a") as f:
                    f.write(json.dumps(line) + "\n")
                    f.flush()

    def reply(self, status, body=b"", headers=(), head=False, cut=None):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        if cut is None:
            self.wfile.write(body)
            return
        # --cut: the full length was promised; deliver `cut` bytes, then hang up mid-body.
        self.wfile.write(body[:cut])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def json(self, status, obj, head=False, error_code=None):
        hdrs = [("Content-Type", "application/json")]
        if error_code:
            hdrs.append(("X-Error-Code", error_code))
        self.reply(status, json.dumps(obj).encode(), hdrs, head)

    # --- routing ------------------------------------------------------------
    def route(self, head):
        cfg = self.cfg
        if cfg.token is not None and self.headers.get("Authorization") != f"Bearer {cfg.token}":
            return self.json(401, {"error": "Invalid credentials in Authorization header"}, head)
        path = urlsplit(self.path).path  # query strings are ignored
        if m := CDN_RE.match(path):
            entry = next((e for e in self.files.values() if e.lfs and e.sha256 == m[1]), None)
            if entry is None:
                return self.json(404, {"error": "Entry not found"}, head, "EntryNotFound")
            return self.serve_bytes(entry, head)
        if m := MODEL_RE.match(path):
            org, name, kind, rev, sub = m.groups()
            if not self.check_repo(org, name, unquote(rev or "main"), head):
                return
            if kind == "tree":
                return self.json(200, self.tree(unquote(sub or "").strip("/"), self.query_flag("recursive")), head)
            siblings = [{"rfilename": p} for p in self.files]
            return self.json(200, {"id": cfg.repo_id, "modelId": cfg.repo_id, "sha": cfg.commit,
                                   "private": False, "gated": False, "disabled": False,
                                   "siblings": siblings}, head)
        if m := RESOLVE_RE.match(path):
            org, name, rev, fpath = m.groups()
            if not self.check_repo(org, name, unquote(rev), head):
                return
            entry = self.files.get(unquote(fpath))
            if entry is None:
                return self.json(404, {"error": "Entry not found"}, head, "EntryNotFound")
            if cfg.redirect and entry.lfs:
                # Like the real Hub's CDN redirect, but to a relative URL on this host.
                return self.reply(302, b"", self.meta_headers(entry) + [("Location", f"/cdn/{entry.sha256}")], head)
            return self.serve_bytes(entry, head)
        return self.json(404, {"error": "Not found"}, head)

    def check_repo(self, org, name, rev, head):
        if f"{org}/{name}" != self.cfg.repo_id:
            self.json(404, {"error": "Repository not found"}, head, "RepoNotFound")
            return False
        if rev not in ("main", self.cfg.commit):
            self.json(404, {"error": f"Invalid rev id: {rev}"}, head, "RevisionNotFound")
            return False
        return True

    def query_flag(self, key):
        q = dict(p.partition("=")[::2] for p in urlsplit(self.path).query.split("&") if p)
        return q.get(key, "").lower() in ("1", "true")

    def tree(self, prefix, recursive):
        """File and directory entries under `prefix` (all levels if recursive)."""
        base = prefix + "/" if prefix else ""
        out, dirs = [], set()
        for p, e in self.files.items():
            if not p.startswith(base):
                continue
            parts = p[len(base):].split("/")
            for i in range(1, len(parts) if recursive else min(len(parts), 2)):
                dirs.add(base + "/".join(parts[:i]))
            if recursive or len(parts) == 1:
                out.append(e.tree_item())
        for d in dirs:
            out.append({"type": "directory", "path": d, "size": 0,
                        "oid": hashlib.sha1(d.encode()).hexdigest()})
        return sorted(out, key=lambda x: x["path"])

    # --- file bytes -----------------------------------------------------------
    def meta_headers(self, entry):
        h = [("X-Repo-Commit", self.cfg.commit), ("ETag", f'"{entry.etag}"'), ("Accept-Ranges", "bytes")]
        if entry.lfs:
            h += [("X-Linked-Etag", f'"{entry.sha256}"'), ("X-Linked-Size", str(entry.size))]
        return h

    def serve_bytes(self, entry, head):
        size, status, start, end = entry.size, 200, 0, entry.size - 1
        extra = []
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        if m:
            start = int(m[1])
            end = min(int(m[2]), size - 1) if m[2] else size - 1
            if start >= size or start > end:
                return self.reply(416, b"", [("Content-Range", f"bytes */{size}")], head)
            status = 206
            extra.append(("Content-Range", f"bytes {start}-{end}/{size}"))
        body = entry.body[start:end + 1]
        headers = self.meta_headers(entry) + extra + [("Content-Type", "application/octet-stream")]
        cut = None
        if not head and self.cfg.cut and self.cfg.cut[0] == entry.path:
            with self.cut_lock:  # only the first GET of that file is cut
                if self.cfg.cut is not None:
                    cut, self.cfg.cut = self.cfg.cut[1], None
        return self.reply(status, body, headers, head, cut)


class QuietServer(ThreadingHTTPServer):
    """A client that hangs up (a test's cut transfer, a client's retry) is not an error here."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repo-dir", required=True)
    ap.add_argument("--repo-id", required=True, help="org/name")
    ap.add_argument("--commit", help="40-hex commit sha (default: sha1 of the repo id)")
    ap.add_argument("--token", help="require `Authorization: Bearer TOKEN` on every request")
    ap.add_argument("--cut", help="FILE:BYTES - first GET of FILE sends only BYTES body bytes, then hangs up")
    ap.add_argument("--corrupt", help="FILE - serve FILE with its middle byte flipped (headers stay correct)")
    ap.add_argument("--redirect", action="store_true", help="302 LFS files to /cdn/<sha256>")
    ap.add_argument("--log", help="append one JSON line per request to this file")
    cfg = ap.parse_args()
    cfg.commit = cfg.commit or hashlib.sha1(cfg.repo_id.encode()).hexdigest()
    if cfg.cut:
        fname, _, n = cfg.cut.rpartition(":")
        cfg.cut = (fname, int(n))

    files = {}
    for root, _dirs, names in os.walk(cfg.repo_dir):
        for n in names:
            full = os.path.join(root, n)
            if os.path.isfile(full) and not os.path.islink(full):
                rel = os.path.relpath(full, cfg.repo_dir).replace(os.sep, "/")
                with open(full, "rb") as f:
                    files[rel] = Entry(rel, f.read(), rel == cfg.corrupt)
    Handler.cfg = cfg
    Handler.files = dict(sorted(files.items()))

    server = QuietServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
