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

The server (this module) keeps the state and the fault injection; the routes are ``loopback_hub_handler.py``,
the stored objects and the Hub's rules ``loopback_hub_model.py``.

Route names (for fault injection and :attr:`LoopbackHubServer.requests`): ``whoami``, ``create_repo``,
``validate_yaml``, ``repo_info``, ``tree``, ``paths_info``, ``preupload``, ``commit``, ``commits``,
``refs``, ``branch``, ``lfs_batch``, ``lfs_upload``, ``lfs_verify``, ``resolve``.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from typing import Dict, List, Optional, Tuple
from urllib.parse import unquote

from loopback_hub_handler import make_handler
from loopback_hub_model import INVALID_CREDENTIALS, Commit, HubHTTPError, Repo, StoredFile


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
        handler = make_handler(self)
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
