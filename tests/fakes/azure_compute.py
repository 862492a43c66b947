"""A fake of Azure Resource Manager for the Azure driver: virtual machines (PUT with
If-None-Match, GET, DELETE, list with instance views and pages), their asynchronous operations,
the network interfaces of a resource group (for addresses), and the IMDS token endpoint.

ARM requests need ``Authorization: Bearer {token}``. Serve it over HTTPS (``certificate``):
azure-core's bearer-token policy refuses plain HTTP.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import FakeServer

SUB = "/subscriptions/{sub}"
RG = SUB + "/resourceGroups/{rg}"
VMS = RG + "/providers/Microsoft.Compute/virtualMachines"


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@dataclass
class FakeAzure(FakeServer):
    """VMs by (resource group, name) in one subscription; operations finish after
    ``polls_until_done`` status reads."""

    token: str = "fake-token"
    resource_groups: set[str] = field(default_factory=lambda: {"hs-rg"})
    vms: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    nics: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls_until_done: int = 1
    page_size: int = 2
    fail_next_create: dict[str, str] | None = None  # the error of the next create's operation
    imds_calls: int = 0
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def routes(self) -> list[web.RouteDef]:
        return [web.put(VMS + "/{name}", self._auth(self._put)),
                web.get(VMS + "/{name}", self._auth(self._get)),
                web.delete(VMS + "/{name}", self._auth(self._delete)),
                web.get(VMS, self._auth(self._list)),
                web.get(SUB + "/providers/Microsoft.Compute/locations/{loc}/operations/{op}",
                        self._auth(self._operation)),
                web.get(RG + "/providers/Microsoft.Network/networkInterfaces",
                        self._auth(self._list_nics)),
                web.get("/metadata/identity/oauth2/token", self._imds)]

    def _auth(self, handler: Any) -> Any:
        async def checked(request: web.Request) -> web.StreamResponse:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return _error(401, "AuthenticationFailed", "bad or missing bearer token")
            rg = request.match_info.get("rg")
            if rg is not None and rg not in self.resource_groups:
                return _error(404, "ResourceGroupNotFound", f"Resource group '{rg}' not found")
            return await handler(request)
        return checked

    # --- helpers for tests ------------------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(n for _, n in self.vms)

    def set_power(self, name: str, power: str | None, provisioning: str = "Succeeded") -> None:
        """Set a VM's power state (``running``, ``deallocated``...; None: not reported yet)."""
        for (_, n), vm in self.vms.items():
            if n == name:
                vm["properties"]["provisioningState"] = provisioning
                vm["_power"] = power

    # --- handlers ---------------------------------------------------------------------------
    def _vm_json(self, vm: dict[str, Any], *, instance_view: bool) -> dict[str, Any]:
        out = {k: v for k, v in vm.items() if not k.startswith("_")}
        if instance_view:
            statuses = [{"code": "ProvisioningState/"
                         + vm["properties"]["provisioningState"].lower()}]
            if vm["_power"]:
                statuses.append({"code": f"PowerState/{vm['_power']}"})
            out = {**out, "properties": {**out["properties"],
                                         "instanceView": {"statuses": statuses}}}
        return out

    async def _put(self, request: web.Request) -> web.Response:
        sub, rg, name = (request.match_info[k] for k in ("sub", "rg", "name"))
        body = await request.json()
        existing = self.vms.get((rg, name))
        if existing is not None:
            if request.headers.get("If-None-Match") == "*":
                return _error(412, "PreconditionFailed",
                              f"The resource '{name}' already exists (If-None-Match: *)")
            return web.json_response(self._vm_json(existing, instance_view=False))
        error, self.fail_next_create = self.fail_next_create, None
        vm_id = f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/" \
                f"virtualMachines/{name}"
        n = next(self._ids)
        vm = {"id": vm_id, "name": name, "type": "Microsoft.Compute/virtualMachines",
              "location": body["location"], "tags": body.get("tags", {}),
              "properties": {**body["properties"], "provisioningState": "Creating",
                             "vmId": f"vm-{n}"},
              "_power": None}
        self.vms[(rg, name)] = vm
        op_id = f"op-{n}"
        self.operations[op_id] = {"polls": 0, "vm": (rg, name), "error": error, "n": n,
                                  "sub": sub}
        response = web.json_response(self._vm_json(vm, instance_view=False), status=201)
        response.headers["Azure-AsyncOperation"] = (
            f"{self.url}/subscriptions/{sub}/providers/Microsoft.Compute/locations/"
            f"{body['location']}/operations/{op_id}?api-version={request.query['api-version']}")
        return response

    async def _operation(self, request: web.Request) -> web.Response:
        op = self.operations.get(request.match_info["op"])
        if op is None:
            return _error(404, "NotFound", "no such operation")
        op["polls"] += 1
        if op["polls"] < self.polls_until_done:
            return web.json_response({"name": request.match_info["op"], "status": "InProgress"})
        vm = self.vms.get(op["vm"])
        if op["error"] is not None:
            if vm is not None:
                vm["properties"]["provisioningState"] = "Failed"
            return web.json_response({"name": request.match_info["op"], "status": "Failed",
                                      "error": op["error"]})
        if vm is not None and vm["properties"]["provisioningState"] == "Creating":
            vm["properties"]["provisioningState"] = "Succeeded"
            vm["_power"] = "running"
            self._attach_nic(op["sub"], op["vm"], vm, op["n"])
        return web.json_response({"name": request.match_info["op"], "status": "Succeeded"})

    def _attach_nic(self, sub: str, key: tuple[str, str], vm: dict[str, Any], n: int) -> None:
        """The NIC the VM's inline configuration creates, as Microsoft.Network lists it."""
        rg = key[0]
        for config in vm["properties"]["networkProfile"]["networkInterfaceConfigurations"]:
            ips = config["properties"]["ipConfigurations"]
            self.nics[(rg, config["name"])] = {
                "id": f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Network/"
                      f"networkInterfaces/{config['name']}",
                "name": config["name"],
                "properties": {"virtualMachine": {"id": vm["id"]}, "ipConfigurations": [
                    {"name": ip["name"], "properties": {
                        "primary": ip["properties"].get("primary", False),
                        "privateIPAddress": f"10.1.0.{n + 3}",
                        "subnet": ip["properties"]["subnet"]}} for ip in ips]}}

    async def _get(self, request: web.Request) -> web.Response:
        vm = self.vms.get((request.match_info["rg"], request.match_info["name"]))
        if vm is None:
            return _error(404, "ResourceNotFound", "The Resource was not found")
        return web.json_response(self._vm_json(
            vm, instance_view=request.query.get("$expand") == "instanceView"))

    async def _delete(self, request: web.Request) -> web.Response:
        rg, name = request.match_info["rg"], request.match_info["name"]
        vm = self.vms.pop((rg, name), None)
        if vm is None:
            return web.Response(status=204)  # ARM: deleting what is not there succeeds
        for config in vm["properties"]["networkProfile"]["networkInterfaceConfigurations"]:
            if config["properties"].get("deleteOption") == "Delete":
                self.nics.pop((rg, config["name"]), None)
        n = next(self._ids)
        op_id = f"op-{n}"
        self.operations[op_id] = {"polls": 0, "vm": (rg, name), "error": None, "n": n,
                                  "sub": request.match_info["sub"]}
        response = web.Response(status=202)
        response.headers["Azure-AsyncOperation"] = (
            f"{self.url}/subscriptions/{request.match_info['sub']}/providers/Microsoft.Compute/"
            f"locations/{vm['location']}/operations/{op_id}"
            f"?api-version={request.query['api-version']}")
        return response

    def _page(self, request: web.Request, items: list[dict[str, Any]]) -> web.Response:
        start = int(request.query.get("$skiptoken") or 0)
        page: dict[str, Any] = {"value": items[start:start + self.page_size]}
        if start + self.page_size < len(items):
            query = {**request.query, "$skiptoken": str(start + self.page_size)}
            page["nextLink"] = str(request.url.with_scheme(
                "https" if self.certificate else "http").with_query(query))
        return web.json_response(page)

    async def _list(self, request: web.Request) -> web.Response:
        rg = request.match_info["rg"]
        view = request.query.get("$expand") == "instanceView"
        return self._page(request, [self._vm_json(vm, instance_view=view)
                                    for (r, _), vm in sorted(self.vms.items()) if r == rg])

    async def _list_nics(self, request: web.Request) -> web.Response:
        rg = request.match_info["rg"]
        return self._page(request, [nic for (r, _), nic in sorted(self.nics.items()) if r == rg])

    async def _imds(self, request: web.Request) -> web.Response:
        if request.headers.get("Metadata") != "true":
            return _error(400, "BadRequest", "Required metadata header not specified")
        self.imds_calls += 1
        return web.json_response({"access_token": self.token,
                                  "expires_on": str(int(time.time()) + 3600),
                                  "resource": request.query.get("resource"),
                                  "token_type": "Bearer"})
