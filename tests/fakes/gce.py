"""A fake of the Compute Engine REST API: the instance and zone-operation calls the GCP driver
makes (insert, delete, list with a label filter and pages, operations wait/get)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import FakeServer

BASE = "/compute/v1/projects/{project}/zones/{zone}"
_FILTER = re.compile(r'^labels\.([a-z0-9_-]+)\s*=\s*"?([a-z0-9_-]*)"?$')


def _error(status: int, reason: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message,
                                        "errors": [{"reason": reason, "message": message}]}},
                             status=status)


@dataclass
class FakeGce(FakeServer):
    """Instances by (project, zone, name); operations finish after ``polls_until_done`` waits."""

    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls_until_done: int = 1
    page_size: int = 2
    # Error of the next insert's operation, e.g. {"code": "ZONE_RESOURCE_POOL_EXHAUSTED", ...}.
    fail_next_insert: dict[str, str] | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def routes(self) -> list[web.RouteDef]:
        return [web.post(BASE + "/instances", self._insert),
                web.get(BASE + "/instances", self._list),
                web.delete(BASE + "/instances/{name}", self._delete),
                web.post(BASE + "/operations/{op}/wait", self._wait),
                web.get(BASE + "/operations/{op}", self._get_operation)]

    def set_status(self, name: str, status: str) -> None:
        """Move an instance to a GCE status (``TERMINATED`` after a preemption, say)."""
        for (_, _, n), instance in self.instances.items():
            if n == name:
                instance["status"] = status

    def names(self) -> list[str]:
        return sorted(n for _, _, n in self.instances)

    def _operation(self, request: web.Request, kind: str, target: str,
                   error: dict[str, str] | None = None) -> dict[str, Any]:
        p, z = request.match_info["project"], request.match_info["zone"]
        n = next(self._ids)
        op = {"kind": "compute#operation", "id": str(n), "name": f"operation-{n}",
              "operationType": kind, "status": "RUNNING", "zone": z,
              "targetLink": f"{self.url}/compute/v1/projects/{p}/zones/{z}/instances/{target}",
              "selfLink": f"{self.url}{BASE.format(project=p, zone=z)}/operations/operation-{n}",
              "_polls": 0, "_error": error}
        self.operations[op["name"]] = op
        return op

    @staticmethod
    def _public(op: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in op.items() if not k.startswith("_")}
        if op["status"] == "DONE" and op["_error"]:
            out["error"] = {"errors": [op["_error"]]}
        return out

    async def _insert(self, request: web.Request) -> web.Response:
        p, z = request.match_info["project"], request.match_info["zone"]
        body = await request.json()
        key = (p, z, body["name"])
        if key in self.instances:
            return _error(409, "alreadyExists",
                          f"The resource 'projects/{p}/zones/{z}/instances/{body['name']}' "
                          "already exists")
        error, self.fail_next_insert = self.fail_next_insert, None
        op = self._operation(request, "insert", body["name"], error)
        if error is None:
            n = len(self.instances) + 2
            self.instances[key] = {
                **body, "kind": "compute#instance", "id": str(1000 + n), "status": "PROVISIONING",
                "zone": f"{self.url}/compute/v1/projects/{p}/zones/{z}",
                "networkInterfaces": [{**nic, "name": f"nic{i}", "networkIP": f"10.0.0.{n}"}
                                      for i, nic in enumerate(body.get("networkInterfaces", []))]}
        return web.json_response(self._public(op))

    async def _delete(self, request: web.Request) -> web.Response:
        p, z, name = (request.match_info[k] for k in ("project", "zone", "name"))
        if self.instances.pop((p, z, name), None) is None:
            return _error(404, "notFound",
                          f"The resource 'projects/{p}/zones/{z}/instances/{name}' was not found")
        return web.json_response(self._public(self._operation(request, "delete", name)))

    async def _list(self, request: web.Request) -> web.Response:
        p, z = request.match_info["project"], request.match_info["zone"]
        items = [i for (ip, iz, _), i in sorted(self.instances.items()) if (ip, iz) == (p, z)]
        if request.query.get("filter"):
            match = _FILTER.match(request.query["filter"])
            if match is None:
                return _error(400, "invalid", f"unsupported filter {request.query['filter']!r}")
            items = [i for i in items if i.get("labels", {}).get(match[1]) == match[2]]
        start = int(request.query.get("pageToken") or 0)
        page: dict[str, Any] = {"kind": "compute#instanceList",
                                "items": items[start:start + self.page_size]}
        if start + self.page_size < len(items):
            page["nextPageToken"] = str(start + self.page_size)
        return web.json_response(page)

    async def _wait(self, request: web.Request) -> web.Response:
        op = self.operations.get(request.match_info["op"])
        if op is None:
            return _error(404, "notFound", "no such operation")
        op["_polls"] += 1
        if op["_polls"] >= self.polls_until_done:
            op["status"] = "DONE"
        return web.json_response(self._public(op))

    async def _get_operation(self, request: web.Request) -> web.Response:
        op = self.operations.get(request.match_info["op"])
        if op is None:
            return _error(404, "notFound", "no such operation")
        return web.json_response(self._public(op))
