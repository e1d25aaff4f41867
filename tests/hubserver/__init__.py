"""A local fake of the ModelScope and Hugging Face hubs for tests: stdlib ``http.server`` in a thread.

It answers the endpoints the real SDKs call, with their JSON envelopes, taken from the installed
``modelscope_hub`` (what ``modelscope`` 1.40 delegates to) and ``huggingface_hub``:

ModelScope
  ``GET /openapi/v1/models``                      search/list: ``{"success", "data": {"models", "total_count", ...}}``
  ``GET /openapi/v1/models/{owner}/{name}``       model metadata (snake_case fields)
  ``GET /api/v1/models/{owner}/{name}/repo/files`` file tree: ``{"Code": 200, "Data": {"Files": [...]}}``
  ``GET /api/v1/models/{owner}/{name}/repo?Revision=&FilePath=``  file bytes, ``Range`` honoured
Hugging Face
  ``GET /api/models``, ``GET /api/models/{id}[/revision/{rev}]``, ``GET|HEAD /{id}/resolve/{rev}/{path}``

Knobs a test turns: ``slow_s`` (every answer waits that long), ``status`` (every answer is that HTTP status), ``web_page``
(every answer is a 200 HTML page: a captive portal; with ``web_page_status`` 404, a website's Not Found page),
``label_html`` (JSON and files labelled text/html, as a mirror may), ``hold`` (an event: every answer waits
until it is set, so a test knows no answer came before, whatever the box's speed), ``drop_once`` (file paths whose first
transfer is cut mid-body), ``short_at`` (every file body ends there without an error), ``cdn`` (files redirected to a
signed link on another host; ``cdn_refusals``: that many 403 pages from it, an expired link), a private repo (401 without
the token) and a gated one (403 without it).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

TOKEN = "test-hub-token"


@dataclass
class FakeRepo:
    """One model repository of the fake hub."""

    repo_id: str
    files: dict[str, bytes]
    downloads: int = 0
    likes: int = 0
    last_modified: str = "2025-01-01T00:00:00Z"
    license: str = "apache-2.0"
    tasks: tuple[str, ...] = ("text-generation",)
    private: bool = False
    gated: bool = False
    sha: str = "0123456789abcdef0123456789abcdef01234567"

    @property
    def owner(self) -> str:
        return self.repo_id.split("/")[0]

    @property
    def name(self) -> str:
        return self.repo_id.split("/")[1]

    def file_entries(self) -> list[dict]:
        return [
            {"Path": path, "Name": path.rsplit("/", 1)[-1], "Size": len(data), "Type": "blob",
             "Sha256": hashlib.sha256(data).hexdigest(), "Revision": "master",
             "CommittedDate": 1735689600}
            for path, data in sorted(self.files.items())
        ]


@dataclass
class FakeHub:
    """State shared by the handler threads; tests change the knobs between calls."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    slow_s: float = 0.0
    status: int | None = None  # every answer is this HTTP status (a hub that is down: 503)
    web_page: bool = False  # every answer is a 200 HTML page: a captive portal, a website at the endpoint
    web_page_status: int = 200  # the status of that page: 404, a website's "Not Found" page for every API path
    label_html: bool = False  # every JSON answer and file is labelled text/html (a mirror or proxy that does so)
    hold: threading.Event | None = None  # answers wait until it is set (a ceiling of a minute)
    held: int = 0  # answers waiting on ``hold`` now: a test can tell the hub still holds one
    chunk_delay_s: float = 0.0  # pause between 64 KiB chunks of a file body (a slow link)
    # A file body stops at this byte of the file until ``stall_release`` is set (a ceiling of a minute):
    # a test can then act on a download that is certainly under way, however fast the box.
    stall_at: int | None = None
    stall_release: threading.Event = field(default_factory=threading.Event)
    # Every file body ends at this byte, cleanly: a Content-Length that says so, no error (past it, a 206 of
    # 0 bytes): a server or proxy that keeps answering short without failing.
    short_at: int | None = None
    drop_once: set[str] = field(default_factory=set)
    # Files are sent from a CDN, as the hubs send theirs: a file's URL answers 302 to a signed link (Expires,
    # Signature) on another host ("localhost", the endpoint being 127.0.0.1). The CDN answers the first
    # ``cdn_refusals`` requests (every one: -1) 403 with ``cdn_refusal_page``: a signed link expired or refused.
    cdn: bool = False
    cdn_refusals: int = 0
    cdn_refusal_page: tuple[str, bytes] = (
        "text/html; charset=utf-8",
        b"<!DOCTYPE html><html><head><title>403 Forbidden</title></head><body><h1>403 Forbidden</h1>"
        b"<p>Request has expired</p><hr><center>cdn</center></body></html>")
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, range header)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, repo: FakeRepo) -> FakeRepo:
        self.repos[repo.repo_id] = repo
        return repo


def _ms_model_json(repo: FakeRepo) -> dict:
    return {
        "id": repo.repo_id, "display_name": repo.name, "description": f"{repo.name} test model",
        "downloads": repo.downloads, "likes": repo.likes, "last_modified": repo.last_modified,
        "created_at": "2024-06-01T00:00:00Z", "license": repo.license, "tasks": list(repo.tasks),
        "tags": ["fake"], "private": repo.private, "gated": repo.gated,
        "file_size": sum(len(data) for data in repo.files.values()),
    }


def _hf_model_json(repo: FakeRepo, full: bool) -> dict:
    data = {
        "_id": repo.sha[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.owner,
        "downloads": repo.downloads, "likes": repo.likes, "lastModified": repo.last_modified.replace("Z", ".000Z"),
        "createdAt": "2024-06-01T00:00:00.000Z", "private": repo.private, "gated": "manual" if repo.gated else False,
        "pipeline_tag": repo.tasks[0] if repo.tasks else None, "library_name": "transformers",
        "tags": ["transformers", "safetensors", f"license:{repo.license}"], "sha": repo.sha,
    }
    if full:
        data["cardData"] = {"license": repo.license}
        data["siblings"] = [
            {"rfilename": path, "size": len(blob),
             **({"lfs": {"sha256": hashlib.sha256(blob).hexdigest(), "size": len(blob),
                         "pointerSize": 134}} if not path.endswith((".md", ".json", ".txt")) else {}),
             "blobId": hashlib.sha1(blob).hexdigest()}
            for path, blob in sorted(repo.files.items())
        ]
        data["usedStorage"] = sum(len(blob) for blob in repo.files.values())
    return data


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub  # set on the subclass
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    # --- plumbing ---------------------------------------------------------------------------------
    def _authorised(self) -> bool:
        if self.headers.get("Authorization", "") == f"Bearer {TOKEN}":
            return True
        return f"m_session_id={TOKEN}" in self.headers.get("Cookie", "")

    def _json(self, status: int, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8" if self.hub.label_html else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)

    def _ms_error(self, status: int, message: str) -> None:
        self._json(status, {"Code": status, "Success": False, "Message": message, "success": False,
                            "message": message, "RequestId": "fake"})

    def _access(self, repo: FakeRepo | None, hf: bool = False) -> bool:
        """Answer 404/401/403 and return False when the caller may not see ``repo``."""
        if repo is None:
            self._ms_error(404, "model not found") if not hf else self._json(404, {"error": "Repository Not Found"})
            return False
        if (repo.private or repo.gated) and not self._authorised():
            # Private: the hub answers 401 (log in); gated: 403 (access not granted to this account).
            status = 401 if repo.private else 403
            message = "login required" if status == 401 else "access to this gated model is not granted"
            self._ms_error(status, message) if not hf else self._json(status, {"error": message})
            return False
        return True

    def _send_file(self, repo: FakeRepo, path: str) -> None:
        data = repo.files.get(path)
        if data is None:
            self._ms_error(404, f"file {path} not found")
            return
        if self.hub.cdn and self._cdn_redirect_or_refusal():
            return
        start, end = 0, len(data) - 1
        status = 200
        header = self.headers.get("Range", "")
        if header.startswith("bytes="):
            first, _, last = header[6:].partition("-")
            start = int(first or 0)
            end = int(last) if last else len(data) - 1
            status = 206
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        if self.hub.short_at is not None:
            end = min(end, self.hub.short_at - 1)
        body = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Type", "text/html" if self.hub.label_html else "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", repo.sha)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{max(start, end)}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with self.hub.lock:
            drop = path in self.hub.drop_once
            self.hub.drop_once.discard(path)
        if drop and len(body) > 1:
            # Half the body, then the connection goes away: what a dropped SSH tunnel looks like.
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        for offset in range(0, len(body), 64 * 1024):
            stall_at = self.hub.stall_at
            if stall_at is not None and start + offset >= stall_at:
                self.wfile.flush()
                self.hub.stall_release.wait(60)
            self.wfile.write(body[offset:offset + 64 * 1024])
            if self.hub.chunk_delay_s:
                self.wfile.flush()
                time.sleep(self.hub.chunk_delay_s)

    def _cdn_redirect_or_refusal(self) -> bool:
        """With ``cdn``: a file's URL at the endpoint answers 302 to its signed link on the CDN's host, and the
        CDN refuses the link while ``cdn_refusals`` last. True when that was the answer."""
        if "Signature=" not in self.path:
            port = self.server.server_address[1]
            joiner = "&" if "?" in self.path else "?"
            location = f"http://localhost:{port}{self.path}{joiner}Expires=1700000000&Signature=fake-signature"
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        with self.hub.lock:
            refuse = self.hub.cdn_refusals != 0
            if self.hub.cdn_refusals > 0:
                self.hub.cdn_refusals -= 1
        if not refuse:
            return False
        content_type, page = self.hub.cdn_refusal_page
        self.send_response(403)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(page)
        return True

    # --- routes -----------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        with self.hub.lock:
            self.hub.requests.append((self.command, url.path, self.headers.get("Range", "")))
        if self.hub.slow_s:
            time.sleep(self.hub.slow_s)
        if self.hub.hold is not None:
            with self.hub.lock:
                self.hub.held += 1
            try:
                self.hub.hold.wait(60)
            finally:
                with self.hub.lock:
                    self.hub.held -= 1
        if self.hub.status:
            return self._json(self.hub.status, {"error": "the fake hub is down"})
        if self.hub.web_page:
            page = b"<!DOCTYPE html><html><head><title>Wi-Fi login</title></head><body>Sign in</body></html>"
            self.send_response(self.hub.web_page_status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(page)
            return
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        repos = self.hub.repos
        try:
            if parts[:3] == ["openapi", "v1", "models"]:
                if len(parts) == 3:
                    return self._ms_list(query)
                repo = repos.get("/".join(parts[3:5]))
                if self._access(repo):
                    self._json(200, {"success": True, "request_id": "fake", "data": _ms_model_json(repo)})
                return
            if parts[:3] == ["api", "v1", "models"] and len(parts) == 5:
                # The legacy metadata endpoint the SDK falls back to when OpenAPI answers 404.
                repo = repos.get("/".join(parts[3:5]))
                if self._access(repo):
                    data = _ms_model_json(repo)
                    self._json(200, {"Code": 200, "Success": True, "Data": {
                        "Path": repo.owner, "Name": repo.name, "Downloads": data["downloads"],
                        "Likes": data["likes"], "License": repo.license, "LastUpdatedTime": 1735689600}})
                return
            if parts[:3] == ["api", "v1", "models"] and len(parts) >= 6:
                repo = repos.get("/".join(parts[3:5]))
                if not self._access(repo):
                    return
                if parts[5:] == ["repo", "files"]:
                    return self._json(200, {"Code": 200, "Success": True, "Data": {"Files": repo.file_entries()}})
                if parts[5:] == ["repo"]:
                    return self._send_file(repo, query.get("FilePath", ""))
            if parts[:2] == ["api", "models"]:
                if len(parts) == 2:
                    return self._hf_list(query)
                repo = repos.get("/".join(parts[2:4]))
                if self._access(repo, hf=True):
                    self._json(200, _hf_model_json(repo, full=True))
                return
            if len(parts) >= 5 and parts[2] == "resolve":
                repo = repos.get("/".join(parts[:2]))
                if self._access(repo, hf=True):
                    self._send_file(repo, "/".join(parts[4:]))
                return
            self._json(404, {"error": f"no route {url.path}"})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _visible(self) -> list[FakeRepo]:
        return [repo for repo in self.hub.repos.values() if not repo.private or self._authorised()]

    def _ms_list(self, query: dict[str, str]) -> None:
        found = self._visible()
        search = query.get("search", "").lower()
        if search:
            found = [repo for repo in found if search in repo.repo_id.lower()]
        if query.get("owner"):
            found = [repo for repo in found if repo.owner == query["owner"]]
        if query.get("filter.task"):
            found = [repo for repo in found if query["filter.task"] in repo.tasks]
        sort = query.get("sort", "default")
        if sort in ("downloads", "likes"):
            found.sort(key=lambda repo: getattr(repo, sort), reverse=True)
        elif sort == "last_modified":
            found.sort(key=lambda repo: repo.last_modified, reverse=True)
        page, size = int(query.get("page_number", 1)), int(query.get("page_size", 10))
        items = found[(page - 1) * size: page * size]
        self._json(200, {"success": True, "request_id": "fake", "data": {
            "models": [_ms_model_json(repo) for repo in items], "total_count": len(found),
            "page_number": page, "page_size": size}})

    def _hf_list(self, query: dict[str, str]) -> None:
        found = self._visible()
        search = query.get("search", "").lower()
        if search:
            found = [repo for repo in found if search in repo.repo_id.lower()]
        if query.get("author"):
            found = [repo for repo in found if repo.owner == query["author"]]
        sort = query.get("sort", "")
        key = {"downloads": "downloads", "likes": "likes", "lastModified": "last_modified"}.get(sort)
        if key:
            found.sort(key=lambda repo: getattr(repo, key), reverse=True)
        limit = int(query.get("limit", 1000))
        self._json(200, [_hf_model_json(repo, full=False) for repo in found[:limit]])


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up mid-connection (a refused web page, an abandoned call) is no error of the
    fake hub: no traceback on stderr, where a test reads the CLI's own output."""

    def handle_error(self, request: object, client_address: object) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class FakeHubServer:
    """``with FakeHubServer(hub) as server: server.url`` — a thread serving ``hub`` on 127.0.0.1."""

    def __init__(self, hub: FakeHub) -> None:
        self.hub = hub
        handler = type("FakeHubHandler", (_Handler,), {"hub": hub})
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeHubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def closed_port_url() -> str:
    """The URL of a port nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def tiny_config(**overrides: object) -> dict:
    """A small Qwen2-shaped config.json."""
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return config


def standard_hub() -> FakeHub:
    """The repos most tests use: a tiny Qwen-shaped model, a Qwen 7B-shaped one, a private and a gated one."""
    hub = FakeHub()
    weights = bytes(range(256)) * 1024  # 256 KiB: several chunks, so a drop lands mid-file
    hub.add(FakeRepo(
        "Qwen/Qwen2.5-Tiny-Instruct",
        files={
            "README.md": b"# Qwen2.5 Tiny\n\nA **tiny** test model.\n\n## Usage\n\nLoad it with transformers.\n",
            "config.json": json.dumps(tiny_config()).encode(),
            "model.safetensors": weights,
            "pytorch_model.bin": b"B" * 4096,
            "tokenizer.json": b'{"version": "1.0"}',
        },
        downloads=5000, likes=40, last_modified="2025-03-01T10:00:00Z",
    ))
    hub.add(FakeRepo(
        "Qwen/Qwen2.5-7B-Instruct",
        files={
            "README.md": b"# Qwen2.5-7B-Instruct\n",
            "config.json": json.dumps({
                "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
                "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
                "tie_word_embeddings": False, "torch_dtype": "bfloat16"}).encode(),
            "model-00001-of-00002.safetensors": b"S" * 2048,
            "model-00002-of-00002.safetensors": b"T" * 2048,
            "model.gguf": b"G" * 1024,
        },
        downloads=900000, likes=800, last_modified="2024-09-19T00:00:00Z",
    ))
    hub.add(FakeRepo("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", files={
        "README.md": b"# R1 distill\n", "config.json": json.dumps(tiny_config()).encode(),
        "model.safetensors": b"D" * 1000}, downloads=300000, likes=1000, last_modified="2025-01-20T00:00:00Z",
        license="mit"))
    hub.add(FakeRepo("acme/private-model", files={"config.json": b"{}"}, private=True))
    hub.add(FakeRepo("meta/gated-model", files={"config.json": b"{}", "README.md": b"# gated\n"}, gated=True))
    return hub
