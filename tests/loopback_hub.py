"""A Hugging Face Hub stand-in served over HTTP on 127.0.0.1, for tests that must not reach the network.

It implements the part of the Hub API that ``huggingface_hub`` 0.36's :class:`~huggingface_hub.HfApi`,
``hf_hub_download`` and ``snapshot_download`` use: whoami, repo creation (models and Spaces), branches,
preupload, ndjson commits (regular and LFS files, deletions), the Git LFS batch API with upload/verify
URLs on this same server, repo info, tree and paths-info listings, commit and ref listings
(``list_repo_commits``, ``list_repo_refs``), ``resolve`` downloads, and
``/api/validate-yaml`` (card metadata checks modelled on what the Hub rejects).

Everything lives in memory: each repo keeps every commit (message, files, parent) so tests can inspect
the history. Tokens map to users; the server never records a token, only the user name.

Tokens have the Hub's roles: a user entry may say ``"role": "read" | "write" | "fineGrained"`` (default
``"write"``) and, for ``"fineGrained"``, ``"fineGrained": {"scoped": [{"entity": {"type": "user"|"org"|"model",
"name": ...}, "permissions": ["repo.write", ...]}]}``; whoami reports them under ``auth.accessToken`` as the
Hub does, and writes (create, commit, branch, LFS) are refused with 403 when the token may not write.

Fault injection: :meth:`LoopbackHubServer.fail_next` makes the next ``n`` requests of a route answer an
error status (optionally with headers such as ``Retry-After``), :meth:`LoopbackHubServer.fail_sequence`
queues one status per request, :meth:`LoopbackHubServer.empty_reply_next` applies the next requests of a
route but answers them with an empty 200 body, :meth:`LoopbackHubServer.latency` delays a route's requests,
:meth:`LoopbackHubServer.rate_limit` answers commits beyond a per-repo quota with 429 and ``Retry-After`` (the
Hub's "128 commits per hour", scaled down).

Route names (for fault injection and :attr:`LoopbackHubServer.requests`): ``whoami``, ``create_repo``,
``validate_yaml``, ``repo_info``, ``tree``, ``paths_info``, ``preupload``, ``commit``, ``commits``,
``refs``, ``branch``, ``lfs_batch``, ``lfs_upload``, ``lfs_verify``, ``resolve``.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

KNOWN_LICENSES = {
    "apache-2.0", "mit", "bsd", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
    "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense",
    "openrail", "openrail++", "bigscience-openrail-m", "creativeml-openrail-m", "llama2", "llama3", "gemma",
    "odc-by", "pddl", "other", "unknown",
}
PIPELINE_TAGS = {"fill-mask", "text-classification", "token-classification", "text-generation", "feature-extraction"}
TYPE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub reports as a regular file's oid/ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class StoredFile:
    content: bytes
    lfs_sha256: Optional[str] = None  # set when the file was committed through LFS

    @property
    def blob_id(self) -> str:
        if self.lfs_sha256:  # the git blob of an LFS file is its pointer file
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.lfs_sha256}\nsize {len(self.content)}\n"
            return git_blob_sha1(pointer.encode())
        return git_blob_sha1(self.content)


@dataclass
class Commit:
    sha: str
    message: str
    description: str
    parent: Optional[str]
    files: Dict[str, StoredFile]  # full tree after this commit
    added: List[str]
    deleted: List[str]
    author: str
    timestamp: float

    def as_dict(self) -> dict:
        return {
            "sha": self.sha, "message": self.message, "description": self.description, "parent": self.parent,
            "files": {p: f.content for p, f in self.files.items()}, "lfs_files": sorted(p for p, f in self.files.items() if f.lfs_sha256),
            "added": list(self.added), "deleted": list(self.deleted), "author": self.author, "timestamp": self.timestamp,
        }


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    owner: str
    sdk: Optional[str] = None
    commits: Dict[str, Commit] = field(default_factory=dict)
    branches: Dict[str, str] = field(default_factory=dict)  # branch -> head commit sha


class HubHTTPError(Exception):
    """Raised inside a handler to answer an HTTP error with the Hub's error headers."""

    def __init__(self, status: int, message: str, error_code: Optional[str] = None, extra: Optional[dict] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.error_code, self.extra = status, message, error_code, extra or {}
        self.headers = headers or {}


def validate_card_metadata(metadata) -> List[str]:
    """Check card metadata the way the Hub does for what hf-tpu-ext writes.

    Args:
        metadata: the parsed YAML block of a README.md.

    Returns:
        A list of error strings (empty when the metadata is valid).
    """
    errors: List[str] = []
    if not isinstance(metadata, dict):
        return ["metadata must be a YAML dictionary"]

    def str_or_str_list(key):
        if key not in metadata:
            return
        value = metadata[key]
        if isinstance(value, str) and value:
            return
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return
        errors.append(f'"{key}" must be a string or an array of strings, got {json.dumps(value)}')

    for key in ("datasets", "base_model", "language", "tags", "license"):
        str_or_str_list(key)
    lic = metadata.get("license")
    if isinstance(lic, str) and lic not in KNOWN_LICENSES:
        errors.append(f'"license" must be a known license identifier, got "{lic}"')
    if "pipeline_tag" in metadata and metadata["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f'"pipeline_tag" is not a known task: {metadata["pipeline_tag"]!r}')
    if "library_name" in metadata and not isinstance(metadata["library_name"], str):
        errors.append('"library_name" must be a string')

    if "model-index" in metadata:
        index = metadata["model-index"]
        if not isinstance(index, list) or not index:
            errors.append('"model-index" must be a non-empty array')
            return errors
        for i, model in enumerate(index):
            where = f"model-index[{i}]"
            if not isinstance(model, dict) or not isinstance(model.get("name"), str) or not model.get("name"):
                errors.append(f'{where}.name must be a non-empty string')
                continue
            results = model.get("results")
            if not isinstance(results, list):
                errors.append(f"{where}.results must be an array")
                continue
            for j, result in enumerate(results):
                rwhere = f"{where}.results[{j}]"
                if not isinstance(result, dict):
                    errors.append(f"{rwhere} must be an object")
                    continue
                task = result.get("task")
                if not isinstance(task, dict) or not isinstance(task.get("type"), str):
                    errors.append(f"{rwhere}.task.type must be a string")
                elif "name" in task and not isinstance(task["name"], str):
                    errors.append(f"{rwhere}.task.name must be a string")
                dataset = result.get("dataset")
                if not isinstance(dataset, dict):
                    errors.append(f"{rwhere}.dataset is required")
                else:
                    for key in ("name", "type"):
                        if not isinstance(dataset.get(key), str) or not dataset.get(key):
                            errors.append(f"{rwhere}.dataset.{key} must be a non-empty string")
                    for key, value in dataset.items():
                        if key == "args":
                            continue
                        if not isinstance(value, str):
                            errors.append(f"{rwhere}.dataset.{key} must be a string, got {json.dumps(value)}")
                metrics = result.get("metrics")
                if not isinstance(metrics, list) or not metrics:
                    errors.append(f"{rwhere}.metrics must be a non-empty array")
                    continue
                for k, metric in enumerate(metrics):
                    mwhere = f"{rwhere}.metrics[{k}]"
                    if not isinstance(metric, dict) or not isinstance(metric.get("type"), str):
                        errors.append(f"{mwhere}.type must be a string")
                        continue
                    value = metric.get("value")
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                        errors.append(f"{mwhere}.value must be a number, got {json.dumps(value)}")
                    if "name" in metric and not isinstance(metric["name"], str):
                        errors.append(f"{mwhere}.name must be a string")
    return errors


def gitattributes_lfs(text: str, path: str) -> bool:
    """Whether a ``.gitattributes`` routes ``path`` through LFS (git: the last line whose pattern matches decides;
    a pattern without ``/`` matches the file name in any folder)."""
    lfs = False
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        pattern = parts[0].lstrip("/")
        target = path if "/" in pattern else path.rsplit("/", 1)[-1]
        if not fnmatch.fnmatchcase(target, pattern):
            continue
        for attr in parts[1:]:
            if attr == "filter=lfs":
                lfs = True
            elif attr in ("-filter", "!filter") or attr.startswith("filter="):
                lfs = False
    return lfs


def split_card(text: str) -> Tuple[object, str]:
    """Split a README.md into (parsed YAML metadata or None, body). Raises ValueError on bad YAML."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n?", text, flags=re.S)
    if not match:
        return None, text
    return yaml.safe_load(match.group(1)), text[match.end():]


class _QuietServer(ThreadingHTTPServer):
    """A client that went away mid-reply (a killed test process) is not an error worth a traceback."""

    def handle_error(self, request, client_address):
        import sys

        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class LoopbackHubServer:
    """An in-memory Hub on ``127.0.0.1:<free port>`` served from a background thread.

    Args:
        users: token -> ``{"name": str, "orgs": [{"name": str, "role": "admin"|"write"|"read"}]}``, plus the
            token's ``"role"`` (``"read"``, ``"write"`` (default), ``"fineGrained"``) and ``"fineGrained"`` scopes.

    Attributes:
        endpoint: ``http://127.0.0.1:<port>``.
        requests: one dict per handled request: ``method``, ``path``, ``route``, ``status``, ``user``.
    """

    def __init__(self, users: Dict[str, dict], niceness: int = 0):
        self.users = users
        # > 0: request threads run at this nice value (Linux: per thread), so a benchmark's stand-in for a
        # remote Hub takes CPU only when the training process leaves some
        self.niceness = int(niceness)
        self._lock = threading.RLock()
        self.reset()
        handler = _make_handler(self)
        self._httpd = _QuietServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="loopback-hub", daemon=True)
        self._thread.start()

    # ---- lifecycle / inspection ---------------------------------------------------------------
    def reset(self) -> None:
        """Forget all repos, LFS objects, faults, latencies and the request log."""
        with self._lock:
            self.repos: Dict[Tuple[str, str], Repo] = {}
            self.lfs_objects: Dict[str, bytes] = {}
            self._faults: List[dict] = []
            self._latency: Dict[Optional[str], float] = {}
            self.requests: List[dict] = []
            self._rate: Optional[Tuple[int, float, float]] = None
            self._commit_times: Dict[Tuple[str, str], List[float]] = {}

    def close(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()

    def fail_next(self, n: int, status: int = 503, route: Optional[str] = "commit",
                  headers: Optional[dict] = None) -> None:
        """Answer the next ``n`` requests of ``route`` (None: any route) with ``status`` (and ``headers``,
        e.g. ``{"Retry-After": "2"}``)."""
        with self._lock:
            self._faults.append({"n": int(n), "status": int(status), "route": route, "headers": dict(headers or {})})

    def fail_sequence(self, statuses, route: Optional[str] = "commit", headers: Optional[dict] = None) -> None:
        """Answer the next requests of ``route`` with ``statuses`` in order, one each (then normally)."""
        for status in statuses:
            self.fail_next(1, status, route, headers)

    def empty_reply_next(self, n: int = 1, route: str = "commit", apply: bool = True) -> None:
        """Answer the next ``n`` requests of ``route`` with HTTP 200 and an empty body; ``apply``: carry them
        out first (the reply is lost), else drop them (e.g. a proxy that answered on its own)."""
        with self._lock:
            self._faults.append({"n": int(n), "status": 200, "route": route, "headers": {}, "empty": True,
                                 "apply": bool(apply)})

    def latency(self, seconds: float, route: Optional[str] = None) -> None:
        """Delay each request of ``route`` (None: every route) by ``seconds``; 0 removes the delay."""
        with self._lock:
            if seconds:
                self._latency[route] = float(seconds)
            else:
                self._latency.pop(route, None)

    def rate_limit(self, commits: int, period: float, retry_after: float) -> None:
        """Allow ``commits`` commits per repo in any ``period`` seconds; answer a commit beyond them with HTTP 429,
        ``Retry-After: <retry_after>`` and the Hub's message (0 commits: no limit)."""
        with self._lock:
            self._rate = (int(commits), float(period), float(retry_after)) if commits else None
            self._commit_times.clear()

    def _over_rate(self, key: Tuple[str, str]) -> Optional[float]:
        """The Retry-After to answer when a commit to ``key`` is over the quota, else None (and count it)."""
        with self._lock:
            if self._rate is None:
                return None
            commits, period, retry_after = self._rate
            now = time.monotonic()
            times = [t for t in self._commit_times.get(key, []) if t > now - period]
            if len(times) >= commits:
                self._commit_times[key] = times
                return retry_after
            self._commit_times[key] = times + [now]
            return None

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        """The stored repo (KeyError when it does not exist)."""
        return self.repos[(repo_type, repo_id)]

    def commits(self, repo_id: str, repo_type: str = "model", branch: str = "main") -> List[dict]:
        """The commits reachable from ``branch``, oldest first, as dicts (see :meth:`Commit.as_dict`)."""
        repo = self.repo(repo_id, repo_type)
        out, sha = [], repo.branches.get(branch)
        while sha:
            commit = repo.commits[sha]
            out.append(commit.as_dict())
            sha = commit.parent
        return out[::-1]

    def files(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> Dict[str, bytes]:
        """Path -> content of the files at ``revision``."""
        repo = self.repo(repo_id, repo_type)
        return {p: f.content for p, f in self._resolve(repo, revision).files.items()}

    # ---- internals -------------------------------------------------------------------------------
    def _take_fault(self, route: str) -> Optional[dict]:
        with self._lock:
            for fault in self._faults:
                if fault["n"] > 0 and fault["route"] in (None, route):
                    fault["n"] -= 1
                    return fault
        return None

    def _delay(self, route: str) -> float:
        with self._lock:
            return self._latency.get(route, 0.0) + self._latency.get(None, 0.0)

    def _user(self, headers) -> Optional[dict]:
        auth = headers.get("Authorization") or ""
        if not auth:
            return None
        token = auth[7:] if auth.lower().startswith("bearer ") else auth
        user = self.users.get(token)
        if user is None:
            raise HubHTTPError(401, INVALID_CREDENTIALS)
        return user

    @staticmethod
    def _can_write(user: Optional[dict], namespace: str, repo_id: Optional[str] = None, repo_type: str = "model") -> bool:
        if user is None or user.get("role") == "read":
            return False
        if user.get("role") == "fineGrained":
            scoped = (user.get("fineGrained") or {}).get("scoped") or []
            if not any("repo.write" in (sc.get("permissions") or [])
                       and ((sc["entity"]["type"] in ("user", "org") and sc["entity"]["name"] == namespace)
                            or (repo_id and sc["entity"]["type"] == repo_type and sc["entity"]["name"] == repo_id))
                       for sc in scoped):
                return False
        if user["name"] == namespace:
            return True
        return any(o["name"] == namespace and o.get("role") in ("admin", "write") for o in user.get("orgs", []))

    def _get_repo(self, repo_type: str, repo_id: str, user: Optional[dict]) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None or (repo.private and not self._can_read_private(user, repo)):
            raise HubHTTPError(404, "Repository not found", "RepoNotFound")
        return repo

    @staticmethod
    def _can_read_private(user, repo) -> bool:
        if user is None:
            return False
        ns = repo.repo_id.split("/")[0]
        return user["name"] == ns or any(o["name"] == ns for o in user.get("orgs", []))

    def _writable_repo(self, repo_type: str, repo_id: str, user: Optional[dict]) -> Repo:
        if user is None:
            raise HubHTTPError(401, "You must be authenticated to write to a repo")
        repo = self._get_repo(repo_type, repo_id, user)
        if not self._can_write(user, repo_id.split("/")[0], repo_id, repo_type):
            raise HubHTTPError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    def _resolve(self, repo: Repo, revision: str) -> Commit:
        revision = unquote(revision)
        if revision in repo.branches:
            return repo.commits[repo.branches[revision]]
        if revision in repo.commits:
            return repo.commits[revision]
        raise HubHTTPError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def _commit(self, repo: Repo, branch: str, message: str, description: str, files: Dict[str, StoredFile],
                added: List[str], deleted: List[str], author: str) -> Commit:
        parent = repo.branches.get(branch)
        sha = hashlib.sha1(f"{repo.repo_id}{parent}{message}{uuid.uuid4()}".encode()).hexdigest()
        commit = Commit(sha, message, description, parent, files, added, deleted, author, time.time())
        repo.commits[sha] = commit
        repo.branches[branch] = sha
        return commit


_REPO = r"(?P<repo_id>[\w.\-]+/[\w.\-]+)"
_TYPES = r"(?P<type>models|datasets|spaces)"


def _routes():
    return [
        ("GET", "whoami", re.compile(r"^/api/whoami-v2$")),
        ("POST", "create_repo", re.compile(r"^/api/repos/create$")),
        ("POST", "validate_yaml", re.compile(r"^/api/validate-yaml$")),
        ("POST", "preupload", re.compile(rf"^/api/{_TYPES}/{_REPO}/preupload/(?P<rev>[^/]+)$")),
        ("POST", "commit", re.compile(rf"^/api/{_TYPES}/{_REPO}/commit/(?P<rev>[^/]+)$")),
        ("GET", "commits", re.compile(rf"^/api/{_TYPES}/{_REPO}/commits/(?P<rev>[^/]+)$")),
        ("POST", "branch", re.compile(rf"^/api/{_TYPES}/{_REPO}/branch/(?P<rev>[^/]+)$")),
        ("POST", "paths_info", re.compile(rf"^/api/{_TYPES}/{_REPO}/paths-info/(?P<rev>[^/]+)$")),
        ("GET", "refs", re.compile(rf"^/api/{_TYPES}/{_REPO}/refs$")),
        ("GET", "tree", re.compile(rf"^/api/{_TYPES}/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")),
        ("GET", "repo_info", re.compile(rf"^/api/{_TYPES}/{_REPO}(?:/revision/(?P<rev>[^/]+))?$")),
        ("POST", "lfs_batch", re.compile(rf"^/(?P<prefix>datasets/|spaces/)?{_REPO}\.git/info/lfs/objects/batch$")),
        ("PUT", "lfs_upload", re.compile(r"^/lfs-upload/(?P<oid>[0-9a-f]{64})$")),
        ("POST", "lfs_verify", re.compile(r"^/lfs-verify/(?P<oid>[0-9a-f]{64})$")),
        ("GET", "resolve", re.compile(rf"^/(?P<prefix>datasets/|spaces/)?{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")),
        ("HEAD", "resolve", re.compile(rf"^/(?P<prefix>datasets/|spaces/)?{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")),
    ]


def _make_handler(hub: LoopbackHubServer):
    routes = _routes()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "LoopbackHub/1.0"

        def log_message(self, format, *args):  # keep pytest output clean
            pass

        def setup(self):
            if hub.niceness > 0 and hasattr(os, "setpriority"):
                try:
                    os.setpriority(os.PRIO_PROCESS, 0, hub.niceness)  # the calling thread only, on Linux
                except OSError:
                    pass
            super().setup()

        # -- plumbing --
        def _body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(self, status: int, body: bytes = b"", headers: Optional[dict] = None, content_type="application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj, headers=None):
            self._send(status, json.dumps(obj).encode(), headers)

        def _dispatch(self):
            split = urlsplit(self.path)
            path, query = split.path, parse_qs(split.query)
            route, match = None, None
            for method, name, pattern in routes:
                if method == self.command:
                    m = pattern.match(path)
                    if m:
                        route, match = name, m
                        break
            record = {"method": self.command, "path": path, "route": route, "status": None, "user": None}
            with hub._lock:
                hub.requests.append(record)
            body = self._body() if self.command in ("POST", "PUT") else b""
            if route is None:
                record["status"] = 404
                return self._json(404, {"error": f"no route {self.command} {path}"})
            delay = hub._delay(route)
            if delay:
                time.sleep(delay)
            fault = hub._take_fault(route)
            if fault is not None and fault.get("empty") and not fault.get("apply"):
                record["status"] = 200
                return self._send(200, b"")
            if fault is not None and not fault.get("empty"):
                status = fault["status"]
                record["status"] = status
                return self._json(status, {"error": f"injected failure {status}"},
                                  {"X-Error-Message": f"injected failure {status}", **fault["headers"]})
            try:
                user = hub._user(self.headers)
                record["user"] = user["name"] if user else None
                with hub._lock:
                    status, payload, headers = getattr(self, "do_" + route)(match, query, body, user)
                if fault is not None:  # carried out, but the reply is lost
                    record["status"] = 200
                    return self._send(200, b"")
            except HubHTTPError as err:
                record["status"] = err.status
                headers = {"X-Error-Message": err.message, **err.headers}
                if err.error_code:
                    headers["X-Error-Code"] = err.error_code
                return self._json(err.status, {"error": err.message, **err.extra}, headers)
            record["status"] = status
            if isinstance(payload, bytes):
                return self._send(status, payload, headers, content_type="application/octet-stream")
            return self._json(status, payload, headers)

        do_GET = do_POST = do_PUT = do_HEAD = _dispatch

        # -- routes --
        def do_whoami(self, m, q, body, user):
            if user is None:
                raise HubHTTPError(401, INVALID_CREDENTIALS)
            orgs = [{"type": "org", "name": o["name"], "roleInOrg": o.get("role", "read")} for o in user.get("orgs", [])]
            access = {"displayName": "loopback", "role": user.get("role", "write"), "createdAt": "2024-01-01T00:00:00.000Z"}
            if access["role"] == "fineGrained":
                fine = user.get("fineGrained") or {}
                access["fineGrained"] = {"canReadGatedRepos": False, "global": list(fine.get("global", [])),
                                         "scoped": [{"entity": dict(sc["entity"]), "permissions": list(sc["permissions"])}
                                                    for sc in fine.get("scoped", [])]}
            return 200, {"type": "user", "name": user["name"], "fullname": user["name"].title(), "orgs": orgs,
                         "auth": {"type": "access_token", "accessToken": access}}, None

        def do_create_repo(self, m, q, body, user):
            data = json.loads(body or b"{}")
            if user is None:
                raise HubHTTPError(401, "You must be authenticated to create a repo")
            namespace = data.get("organization") or user["name"]
            name = data.get("name") or ""
            repo_type = data.get("type") or "model"
            repo_id = f"{namespace}/{name}"
            if not re.fullmatch(r"[\w.\-]{1,96}", name):
                raise HubHTTPError(400, f"Invalid repo name {name!r}")
            if repo_type == "space" and not data.get("sdk"):
                raise HubHTTPError(400, "A Space needs an sdk")
            if not hub._can_write(user, namespace):
                raise HubHTTPError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{namespace}"')
            url = f"{hub.endpoint}/{TYPE_PREFIX[repo_type]}{repo_id}"
            if (repo_type, repo_id) in hub.repos:
                raise HubHTTPError(409, "You already created this repo", extra={"url": url})
            repo = Repo(repo_id, repo_type, bool(data.get("private")), namespace, data.get("sdk"))
            hub.repos[(repo_type, repo_id)] = repo
            attrs = StoredFile(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n")
            hub._commit(repo, "main", "initial commit", "", {".gitattributes": attrs}, [".gitattributes"], [], user["name"])
            return 200, {"url": url, "name": repo_id, "id": repo_id}, None

        def do_validate_yaml(self, m, q, body, user):
            data = json.loads(body or b"{}")
            try:
                metadata, _ = split_card(data.get("content", ""))
            except yaml.YAMLError as err:
                raise HubHTTPError(400, f"Invalid YAML in metadata: {err}")
            if metadata is None:
                metadata = {}
            errors = validate_card_metadata(metadata)
            if errors:
                raise HubHTTPError(400, "; ".join(errors))
            return 200, {"errors": [], "warnings": []}, None

        def _type(self, m):
            return m.group("type")[:-1]

        def do_repo_info(self, m, q, body, user):
            repo = hub._get_repo(self._type(m), m.group("repo_id"), user)
            commit = hub._resolve(repo, m.group("rev") or "main")
            siblings = []
            for path, f in sorted(commit.files.items()):
                sib = {"rfilename": path}
                if q.get("blobs"):
                    sib.update(size=len(f.content), blobId=f.blob_id)
                    if f.lfs_sha256:
                        sib["lfs"] = {"sha256": f.lfs_sha256, "size": len(f.content), "pointerSize": 134}
                siblings.append(sib)
            info = {"_id": repo.repo_id, "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.owner,
                    "sha": commit.sha, "private": repo.private, "disabled": False, "gated": False,
                    "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(commit.timestamp)),
                    "tags": [], "siblings": siblings, "createdAt": "2024-01-01T00:00:00.000Z"}
            readme = commit.files.get("README.md")
            if readme is not None and not readme.lfs_sha256:  # as the Hub: no card metadata from an LFS pointer
                try:
                    metadata, _ = split_card(readme.content.decode("utf-8"))
                except (yaml.YAMLError, UnicodeDecodeError):
                    metadata = None
                if isinstance(metadata, dict):
                    info["cardData"] = metadata
                    tags = metadata.get("tags") or []
                    info["tags"] = [tags] if isinstance(tags, str) else list(tags)
                    if metadata.get("pipeline_tag"):
                        info["pipeline_tag"] = metadata["pipeline_tag"]
            if repo.repo_type == "space":
                info.update(sdk=repo.sdk, runtime={"stage": "RUNNING", "hardware": {"current": "cpu-basic", "requested": "cpu-basic"}})
            return 200, info, None

        def do_refs(self, m, q, body, user):
            """``list_repo_refs``: the branches (no tags, converts or pull requests on this server)."""
            repo = hub._get_repo(self._type(m), m.group("repo_id"), user)
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha} for b, sha in sorted(repo.branches.items())]
            refs = {"branches": branches, "tags": [], "converts": []}
            if q.get("include_prs"):
                refs["pullRequests"] = []
            return 200, refs, None

        def _entry(self, path, f: StoredFile):
            entry = {"type": "file", "path": path, "size": len(f.content), "oid": f.blob_id}
            if f.lfs_sha256:
                entry["lfs"] = {"oid": f.lfs_sha256, "size": len(f.content), "pointerSize": 134}
            return entry

        def _listing(self, commit: Commit, prefix: str, recursive: bool) -> List[dict]:
            prefix = prefix.strip("/")
            out, folders = [], set()
            for path, f in sorted(commit.files.items()):
                if prefix and not path.startswith(prefix + "/"):
                    continue
                rest = path[len(prefix) + 1:] if prefix else path
                parts = rest.split("/")
                base = (prefix + "/") if prefix else ""
                for i in range(1, len(parts)):
                    folder = base + "/".join(parts[:i])
                    if (recursive or i == 1) and folder not in folders:
                        folders.add(folder)
                        out.append({"type": "directory", "path": folder, "oid": hashlib.sha1(folder.encode()).hexdigest(), "size": 0})
                if recursive or len(parts) == 1:
                    out.append(self._entry(path, f))
            return out

        def do_tree(self, m, q, body, user):
            repo = hub._get_repo(self._type(m), m.group("repo_id"), user)
            commit = hub._resolve(repo, m.group("rev"))
            prefix = unquote(m.group("path") or "")
            recursive = (q.get("recursive", ["false"])[0].lower() == "true")
            if prefix and not any(p.startswith(prefix.strip("/") + "/") for p in commit.files):
                raise HubHTTPError(404, f"Path {prefix} not found", "EntryNotFound")
            return 200, self._listing(commit, prefix, recursive), None

        def do_paths_info(self, m, q, body, user):
            repo = hub._get_repo(self._type(m), m.group("repo_id"), user)
            commit = hub._resolve(repo, m.group("rev"))
            form = parse_qs(body.decode())
            out = []
            for path in form.get("paths", []):
                if path in commit.files:
                    out.append(self._entry(path, commit.files[path]))
                elif any(p.startswith(path.rstrip("/") + "/") for p in commit.files):
                    out.append({"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0})
            return 200, out, None

        def do_preupload(self, m, q, body, user):
            repo = hub._writable_repo(self._type(m), m.group("repo_id"), user)
            data = json.loads(body)
            try:
                current = hub._resolve(repo, m.group("rev")).files
            except HubHTTPError:
                current = {}
            lfs_patterns = ("*.safetensors", "*.bin", "*.h5", "*.index", "*.data-*", "*.png", "*.msgpack", "*.ckpt")
            attributes = current.get(".gitattributes")
            files = []
            for f in data.get("files", []):
                name = f["path"].rsplit("/", 1)[-1]
                lfs = f.get("size", 0) > 10 * 1024 * 1024 or any(fnmatch.fnmatch(name, p) for p in lfs_patterns)
                # as the Hub: a file the repo's .gitattributes routes through LFS is uploaded as LFS
                lfs = lfs or bool(attributes and gitattributes_lfs(attributes.content.decode(), f["path"]))
                existing = current.get(f["path"])
                files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                              "oid": existing.blob_id if existing else None})
            return 200, {"files": files, "commitOid": None}, None

        def do_branch(self, m, q, body, user):
            repo = hub._writable_repo(self._type(m), m.group("repo_id"), user)
            branch = unquote(m.group("rev"))
            if branch in repo.branches:
                raise HubHTTPError(409, f"Reference refs/heads/{branch} already exists")
            data = json.loads(body or b"{}")
            start = hub._resolve(repo, data.get("startingPoint") or "main")
            repo.branches[branch] = start.sha
            return 200, {}, None

        def do_commit(self, m, q, body, user):
            repo_type, repo_id = self._type(m), m.group("repo_id")
            repo = hub._writable_repo(repo_type, repo_id, user)
            retry_after = hub._over_rate((repo_type, repo_id))
            if retry_after is not None:
                raise HubHTTPError(429, "You have exceeded the rate limit for repository commits (128 per hour). "
                                   "You can retry this action in about 1 hour.",
                                   headers={"Retry-After": f"{retry_after:g}"})
            branch = unquote(m.group("rev"))
            if branch not in repo.branches:
                raise HubHTTPError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            files = dict(repo.commits[repo.branches[branch]].files)
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            header = next((l["value"] for l in lines if l["key"] == "header"), None)
            if header is None or not header.get("summary"):
                raise HubHTTPError(400, "The commit header with a summary is missing")
            if header.get("parentCommit") and header["parentCommit"] != repo.branches[branch]:
                raise HubHTTPError(412, "A commit has happened since the parent commit")
            added, deleted = [], []
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    files[value["path"]] = StoredFile(base64.b64decode(value["content"]))
                    added.append(value["path"])
                elif key == "lfsFile":
                    oid = value["oid"]
                    if oid in hub.lfs_objects:
                        content = hub.lfs_objects[oid]
                    else:
                        known = next((f for c in repo.commits.values() for f in c.files.values() if f.lfs_sha256 == oid), None)
                        if known is None:
                            raise HubHTTPError(400, f"LFS object {oid} was not uploaded")
                        content = known.content
                    files[value["path"]] = StoredFile(content, lfs_sha256=oid)
                    added.append(value["path"])
                elif key == "deletedFile":
                    if value["path"] not in files:
                        raise HubHTTPError(404, f"File {value['path']} not found", "EntryNotFound")
                    del files[value["path"]]
                    deleted.append(value["path"])
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    gone = [p for p in files if p.startswith(prefix)]
                    for p in gone:
                        del files[p]
                    deleted.extend(gone)
            commit = hub._commit(repo, branch, header["summary"], header.get("description", ""), files, added, deleted, user["name"])
            url = f"{hub.endpoint}/{TYPE_PREFIX[repo_type]}{repo_id}/commit/{commit.sha}"
            return 200, {"success": True, "commitOid": commit.sha, "commitUrl": url, "pullRequestUrl": None}, None

        def do_commits(self, m, q, body, user):
            repo = hub._get_repo(self._type(m), m.group("repo_id"), user)
            sha = hub._resolve(repo, m.group("rev")).sha
            out = []
            while sha:  # newest first, as the Hub lists them
                c = repo.commits[sha]
                out.append({"id": c.sha, "title": c.message,
                            "message": c.message + (f"\n\n{c.description}" if c.description else ""),
                            "authors": [{"user": c.author}],
                            "date": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(c.timestamp))})
                sha = c.parent
            return 200, out, None

        def do_lfs_batch(self, m, q, body, user):
            repo_type = {"datasets/": "dataset", "spaces/": "space"}.get(m.group("prefix") or "", "model")
            hub._writable_repo(repo_type, m.group("repo_id"), user)
            data = json.loads(body)
            objects = []
            for obj in data.get("objects", []):
                entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
                if obj["oid"] not in hub.lfs_objects:
                    entry["actions"] = {
                        "upload": {"href": f"{hub.endpoint}/lfs-upload/{obj['oid']}"},
                        "verify": {"href": f"{hub.endpoint}/lfs-verify/{obj['oid']}"},
                    }
                objects.append(entry)
            return 200, {"transfer": "basic", "objects": objects}, None

        def do_lfs_upload(self, m, q, body, user):
            oid = m.group("oid")
            if hashlib.sha256(body).hexdigest() != oid:
                raise HubHTTPError(400, "Uploaded content does not match its sha256")
            hub.lfs_objects[oid] = body
            return 200, {}, None

        def do_lfs_verify(self, m, q, body, user):
            oid = m.group("oid")
            data = json.loads(body or b"{}")
            if oid not in hub.lfs_objects or data.get("size") not in (None, len(hub.lfs_objects[oid])):
                raise HubHTTPError(404, f"LFS object {oid} not found")
            return 200, {}, None

        def do_resolve(self, m, q, body, user):
            repo_type = {"datasets/": "dataset", "spaces/": "space"}.get(m.group("prefix") or "", "model")
            repo = hub._get_repo(repo_type, m.group("repo_id"), user)
            commit = hub._resolve(repo, m.group("rev"))
            path = unquote(m.group("path"))
            f = commit.files.get(path)
            headers = {"X-Repo-Commit": commit.sha}
            if f is None:
                err = HubHTTPError(404, "Entry not found", "EntryNotFound")
                raise err
            headers["ETag"] = f'"{f.blob_id}"'
            if f.lfs_sha256:
                headers["X-Linked-Etag"] = f'"{f.lfs_sha256}"'
                headers["X-Linked-Size"] = len(f.content)
            content = f.content
            rng = self.headers.get("Range")
            if rng and self.command == "GET":
                start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                content = content[start:]
                headers["Content-Range"] = f"bytes {start}-{len(f.content) - 1}/{len(f.content)}"
                headers["Content-Length"] = len(content)
                return 206, content, headers
            headers["Content-Length"] = len(content)
            return 200, content, headers

    return Handler
