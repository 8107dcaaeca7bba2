"""A Docker registry on 127.0.0.1 that serves one tiny image, for pulls without the internet.

A test double for a registry (``registry:2`` cannot be fetched offline): an aiohttp server
speaking the Docker Registry HTTP API V2 that a real ``dockerd`` pulls from: ``GET /v2/``,
``HEAD``/``GET /v2/<name>/manifests/<tag or digest>`` (an image manifest V2, schema 2, with
``Docker-Content-Digest``) and ``GET /v2/<name>/blobs/<digest>``; anything else is the
registry's JSON error (``MANIFEST_UNKNOWN``, ``BLOB_UNKNOWN``). The daemon reaches a
registry on a loopback address over plain HTTP (loopback is insecure by default). The
image is one gzipped layer holding one file, with a config for this machine's architecture.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import tarfile

from aiohttp import web

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer() -> tuple[bytes, str]:
    """A gzipped tar of one file, and the digest of the tar itself (its ``diff_id``)."""
    content = b"served by agentrl's registry double\n"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("agentrl-registry-double.txt")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0), _digest(raw)


class RegistryDouble:
    """Serves ``repository:tag`` (one tiny image) at ``address`` once ``start`` ran."""

    def __init__(self, repository: str, tag: str) -> None:
        self.repository, self.tag = repository, tag
        layer, diff_id = _layer()
        config = json.dumps(
            {
                "architecture": _ARCH.get(platform.machine(), platform.machine()),
                "os": "linux",
                "config": {"Cmd": ["/bin/true"]},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
                "history": [{"created_by": "agentrl registry double"}],
            }
        ).encode()
        self.blobs = {_digest(layer): layer, _digest(config): config}
        self.manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_TYPE,
                "config": {
                    "mediaType": "application/vnd.docker.container.image.v1+json",
                    "size": len(config),
                    "digest": _digest(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": len(layer),
                        "digest": _digest(layer),
                    }
                ],
            }
        ).encode()
        #: The manifest's digest: ``repository@manifest_digest`` pulls the image too.
        self.manifest_digest = _digest(self.manifest)
        self.requests: list[str] = []
        self.address = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        """Listen on 127.0.0.1 (a free port); returns ``127.0.0.1:PORT``."""
        app = web.Application()
        app.router.add_get("/v2/", self._base)
        app.router.add_route("*", r"/v2/{name:.+}/manifests/{ref}", self._manifest)
        app.router.add_route("*", r"/v2/{name:.+}/blobs/{digest}", self._blob)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.address = f"127.0.0.1:{port}"
        return self.address

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @staticmethod
    def _error(code: str, status: int) -> web.Response:
        body = {"errors": [{"code": code, "message": code.lower().replace("_", " ")}]}
        return web.json_response(body, status=status)

    async def _base(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        return web.json_response({}, headers={"Docker-Distribution-API-Version": "registry/2.0"})

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        name, ref = request.match_info["name"], request.match_info["ref"]
        if name != self.repository or ref not in (self.tag, _digest(self.manifest)):
            return self._error("MANIFEST_UNKNOWN", 404)
        headers = {
            "Content-Type": MANIFEST_TYPE,
            "Docker-Content-Digest": _digest(self.manifest),
            "Docker-Distribution-API-Version": "registry/2.0",
        }
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(self.manifest))
            return web.Response(headers=headers)
        return web.Response(body=self.manifest, headers=headers)

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        blob = self.blobs.get(request.match_info["digest"])
        if request.match_info["name"] != self.repository or blob is None:
            return self._error("BLOB_UNKNOWN", 404)
        headers = {"Docker-Content-Digest": request.match_info["digest"]}
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(blob))
            return web.Response(headers=headers)
        return web.Response(
            body=blob, headers={**headers, "Content-Type": "application/octet-stream"}
        )
