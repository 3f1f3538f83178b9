#!/usr/bin/env python3
"""A fake Hugging Face Hub on loopback serving one model repo from a local directory: exactly the
endpoints huggingface_hub 0.36's snapshot_download uses --

  GET  /api/models/{repo}/revision/{rev}     repo_info: {"id", "sha", "siblings": [{"rfilename"}]}
  HEAD /{repo}/resolve/{rev}/{file}          get_hf_file_metadata: X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}          the bytes

Prints "listening on PORT" on stdout, appends "METHOD PATH" of every request to --log.
"""
import argparse
import hashlib
import http.server
import json
import os
import sys
import urllib.parse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--log", required=True)
    a = ap.parse_args()
    files = sorted(f for f in os.listdir(a.dir) if os.path.isfile(os.path.join(a.dir, f)))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, body=b"", headers=None, head=False):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def route(self, head):
            path = urllib.parse.urlparse(self.path).path
            with open(a.log, "a") as f:
                f.write(f"{self.command} {urllib.parse.unquote(path)}\n")
            info = f"/api/models/{a.repo}/revision/"
            if path.startswith(info):
                rev = urllib.parse.unquote(path[len(info):])
                if rev not in ("main", a.commit):
                    return self.send(404, b'{"error": "Revision not found"}', {"X-Error-Code": "RevisionNotFound"})
                body = json.dumps({"id": a.repo, "modelId": a.repo, "sha": a.commit,
                                   "siblings": [{"rfilename": n} for n in files]}).encode()
                return self.send(200, body, {"Content-Type": "application/json"}, head)
            prefix = f"/{a.repo}/resolve/"
            if path.startswith(prefix):
                rev, _, name = urllib.parse.unquote(path[len(prefix):]).partition("/")
                if rev not in ("main", a.commit) or name not in files:
                    return self.send(404, b"not found", {"X-Error-Code": "EntryNotFound"}, head)
                with open(os.path.join(a.dir, name), "rb") as f:
                    data = f.read()
                etag = hashlib.sha256(data).hexdigest()
                return self.send(200, data, {"X-Repo-Commit": a.commit, "ETag": f'"{etag}"',
                                             "Content-Type": "application/octet-stream"}, head)
            self.send(404, b"no such endpoint", {"X-Error-Code": "RepoNotFound"}, head)

        def do_GET(self):
            self.route(False)

        def do_HEAD(self):
            self.route(True)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on {srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
