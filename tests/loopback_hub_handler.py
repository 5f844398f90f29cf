"""The loopback Hub's HTTP handler (``tests/loopback_hub.py`` serves it): one method per Hub route, each reading and
writing the server's in-memory repos (``self.hub``)."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import os
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import List, Optional
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from loopback_hub_model import (INVALID_CREDENTIALS, TYPE_PREFIX, Commit, HubHTTPError, Repo, StoredFile,
                                gitattributes_lfs, split_card, validate_card_metadata)

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


ROUTES = _routes()


class HubHandler(BaseHTTPRequestHandler):
    """One request to the loopback Hub; :func:`make_handler` binds it to its server (``hub``)."""

    hub = None  # the LoopbackHubServer (set by make_handler)
    protocol_version = "HTTP/1.1"
    server_version = "LoopbackHub/1.0"

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def setup(self):
        if self.hub.niceness > 0 and hasattr(os, "setpriority"):
            try:
                os.setpriority(os.PRIO_PROCESS, 0, self.hub.niceness)  # the calling thread only, on Linux
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
        for method, name, pattern in ROUTES:
            if method == self.command:
                m = pattern.match(path)
                if m:
                    route, match = name, m
                    break
        record = {"method": self.command, "path": path, "route": route, "status": None, "user": None}
        with self.hub._lock:
            self.hub.requests.append(record)
        body = self._body() if self.command in ("POST", "PUT") else b""
        if route is None:
            record["status"] = 404
            return self._json(404, {"error": f"no route {self.command} {path}"})
        delay = self.hub._delay(route)
        if delay:
            time.sleep(delay)
        fault = self.hub._take_fault(route)
        if fault is not None and fault.get("empty") and not fault.get("apply"):
            record["status"] = 200
            return self._send(200, b"")
        if fault is not None and not fault.get("empty"):
            status = fault["status"]
            record["status"] = status
            return self._json(status, {"error": f"injected failure {status}"},
                              {"X-Error-Message": f"injected failure {status}", **fault["headers"]})
        try:
            user = self.hub._user(self.headers)
            record["user"] = user["name"] if user else None
            with self.hub._lock:
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
        if not self.hub._can_write(user, namespace):
            raise HubHTTPError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{namespace}"')
        url = f"{self.hub.endpoint}/{TYPE_PREFIX[repo_type]}{repo_id}"
        if (repo_type, repo_id) in self.hub.repos:
            raise HubHTTPError(409, "You already created this repo", extra={"url": url})
        repo = Repo(repo_id, repo_type, bool(data.get("private")), namespace, data.get("sdk"))
        self.hub.repos[(repo_type, repo_id)] = repo
        attrs = StoredFile(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.bin filter=lfs diff=lfs merge=lfs -text\n")
        self.hub._commit(repo, "main", "initial commit", "", {".gitattributes": attrs}, [".gitattributes"], [], user["name"])
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
        repo = self.hub._get_repo(self._type(m), m.group("repo_id"), user)
        commit = self.hub._resolve(repo, m.group("rev") or "main")
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
        repo = self.hub._get_repo(self._type(m), m.group("repo_id"), user)
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
        repo = self.hub._get_repo(self._type(m), m.group("repo_id"), user)
        commit = self.hub._resolve(repo, m.group("rev"))
        prefix = unquote(m.group("path") or "")
        recursive = (q.get("recursive", ["false"])[0].lower() == "true")
        if prefix and not any(p.startswith(prefix.strip("/") + "/") for p in commit.files):
            raise HubHTTPError(404, f"Path {prefix} not found", "EntryNotFound")
        return 200, self._listing(commit, prefix, recursive), None

    def do_paths_info(self, m, q, body, user):
        repo = self.hub._get_repo(self._type(m), m.group("repo_id"), user)
        commit = self.hub._resolve(repo, m.group("rev"))
        form = parse_qs(body.decode())
        out = []
        for path in form.get("paths", []):
            if path in commit.files:
                out.append(self._entry(path, commit.files[path]))
            elif any(p.startswith(path.rstrip("/") + "/") for p in commit.files):
                out.append({"type": "directory", "path": path, "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0})
        return 200, out, None

    def do_preupload(self, m, q, body, user):
        repo = self.hub._writable_repo(self._type(m), m.group("repo_id"), user)
        data = json.loads(body)
        try:
            current = self.hub._resolve(repo, m.group("rev")).files
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
        repo = self.hub._writable_repo(self._type(m), m.group("repo_id"), user)
        branch = unquote(m.group("rev"))
        if branch in repo.branches:
            raise HubHTTPError(409, f"Reference refs/heads/{branch} already exists")
        data = json.loads(body or b"{}")
        start = self.hub._resolve(repo, data.get("startingPoint") or "main")
        repo.branches[branch] = start.sha
        return 200, {}, None

    def do_commit(self, m, q, body, user):
        repo_type, repo_id = self._type(m), m.group("repo_id")
        repo = self.hub._writable_repo(repo_type, repo_id, user)
        retry_after = self.hub._over_rate((repo_type, repo_id))
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
                if oid in self.hub.lfs_objects:
                    content = self.hub.lfs_objects[oid]
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
        commit = self.hub._commit(repo, branch, header["summary"], header.get("description", ""), files, added, deleted, user["name"])
        url = f"{self.hub.endpoint}/{TYPE_PREFIX[repo_type]}{repo_id}/commit/{commit.sha}"
        return 200, {"success": True, "commitOid": commit.sha, "commitUrl": url, "pullRequestUrl": None}, None

    def do_commits(self, m, q, body, user):
        repo = self.hub._get_repo(self._type(m), m.group("repo_id"), user)
        sha = self.hub._resolve(repo, m.group("rev")).sha
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
        self.hub._writable_repo(repo_type, m.group("repo_id"), user)
        data = json.loads(body)
        objects = []
        for obj in data.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.hub.lfs_objects:
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.endpoint}/lfs-upload/{obj['oid']}"},
                    "verify": {"href": f"{self.hub.endpoint}/lfs-verify/{obj['oid']}"},
                }
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}, None

    def do_lfs_upload(self, m, q, body, user):
        oid = m.group("oid")
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubHTTPError(400, "Uploaded content does not match its sha256")
        self.hub.lfs_objects[oid] = body
        return 200, {}, None

    def do_lfs_verify(self, m, q, body, user):
        oid = m.group("oid")
        data = json.loads(body or b"{}")
        if oid not in self.hub.lfs_objects or data.get("size") not in (None, len(self.hub.lfs_objects[oid])):
            raise HubHTTPError(404, f"LFS object {oid} not found")
        return 200, {}, None

    def do_resolve(self, m, q, body, user):
        repo_type = {"datasets/": "dataset", "spaces/": "space"}.get(m.group("prefix") or "", "model")
        repo = self.hub._get_repo(repo_type, m.group("repo_id"), user)
        commit = self.hub._resolve(repo, m.group("rev"))
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


def make_handler(hub) -> type:
    """The handler class of ``hub`` (a :class:`loopback_hub.LoopbackHubServer`) for ``ThreadingHTTPServer``."""
    return type("Handler", (HubHandler,), {"hub": hub})
