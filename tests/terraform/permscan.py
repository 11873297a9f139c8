"""Derive the cloud permissions hybrid-broker's provider adapters need, from their code.

The scan reads ``providers/**/*.py`` with :mod:`ast` (nothing is imported or run) and maps each SDK call to the
permission the cloud checks for it, using the SDKs' own sources or models rather than a copied list:

* boto3: a method called on a client (``ec2.describe_instance_types(...)``, ``get_paginator("...")``) is an
  operation of botocore's service model; its IAM action is ``<signing name>:<OperationName>``.
* libcloud EC2 (``EC2NodeDriver``): each driver method used (``create_node``, ``list_nodes``...) is followed
  through libcloud's own source, transitively over ``self.<method>()`` calls, to the ``"Action": "RunInstances"``
  query parameters it sends; the EC2 Query action name is the IAM action name.
* azure-mgmt-compute: ``client.<group>.<operation>()`` is followed to the ``build_*_request`` function it
  uses, whose HTTP method and URL template give the Azure RBAC action
  (``PUT .../Microsoft.Compute/virtualMachines/{vmName}`` -> ``Microsoft.Compute/virtualMachines/write``).
* libcloud GCE (``GCENodeDriver``): each driver method used is followed the same way to the REST paths and HTTP
  methods it requests; ``POST /zones/{}/instances`` -> ``compute.instances.create``.

Some permissions are checked by the cloud without a call of their own (tags given at launch, the NIC a VM joins,
the operation a GCE request is polled through): :data:`IMPLIED` names them, each with its trigger and reason.

Run ``python -m tests.terraform.permscan`` to print the table the identity modules' READMEs carry.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["IMPLIED", "NO_PERMISSION", "Scan", "scan_providers"]

CLOUDS = ("aws", "azure", "gcp")

# Calls that need no permission at all: identity look-ups answered for any valid credential.
NO_PERMISSION = frozenset({"sts:GetCallerIdentity"})

# trigger permission -> {implied permission: why the cloud checks it although no call of ours names it}
IMPLIED: dict[str, dict[str, str]] = {
    "ec2:RunInstances": {
        "ec2:CreateTags": "tags passed at launch (TagSpecification) are authorized as ec2:CreateTags "
        "with ec2:CreateAction=RunInstances",
    },
    "Microsoft.Compute/virtualMachines/write": {
        "Microsoft.Network/networkInterfaces/join/action": "a new VM joins the network interface named in "
        "its networkProfile",
    },
    "Microsoft.Network/networkInterfaces/write": {
        "Microsoft.Network/virtualNetworks/subnets/join/action": "a new NIC joins the subnet named in its "
        "ipConfigurations",
    },
    "compute.instances.create": {
        "compute.disks.create": "the boot disk is created with the instance",
        "compute.images.useReadOnly": "the boot disk is created from a public image",
        "compute.networks.use": "the instance is attached to a network",
        "compute.networks.useExternalIp": "the instance gets an ephemeral external IP (external_ip=True)",
        "compute.disks.setLabels": "labels (hb-job) passed on the boot disk at creation",
        "compute.subnetworks.use": "the instance is attached to a subnetwork",
        "compute.subnetworks.useExternalIp": "the external IP is on the subnetwork",
        "compute.instances.setMetadata": "metadata passed at creation",
        "compute.instances.setLabels": "labels (hb-job) passed at creation",
        "compute.zoneOperations.get": "libcloud polls the zone operation until the instance exists",
    },
    "compute.machineTypes.list": {
        "compute.zones.list": "Libcloud's GCENodeDriver lists every zone when the adapter builds it (zone_dict)",
    },
    "compute.instances.delete": {
        "compute.zoneOperations.get": "libcloud polls the zone operation until the instance is gone",
    },
}


@dataclass
class Scan:
    """Permissions per cloud, each with the code paths that need it (``providers/aws.py:AwsProvider.launch ...``)."""

    permissions: dict[str, dict[str, set[str]]] = field(default_factory=lambda: {c: {} for c in CLOUDS})
    # Azure actions whose URL is scoped to a resource group (the rest are subscription-level reads).
    azure_resource_group_scoped: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)

    def add(self, cloud: str, permission: str, where: str) -> None:
        if permission in NO_PERMISSION:
            return
        self.permissions[cloud].setdefault(permission, set()).add(where)

    def of(self, cloud: str) -> set[str]:
        """All permissions of one cloud, implied ones included."""
        return set(self.permissions[cloud])

    def finish(self) -> None:
        """Add the implied permissions of every trigger that was found."""
        for cloud in CLOUDS:
            for trigger in list(self.permissions[cloud]):
                for implied, reason in IMPLIED.get(trigger, {}).items():
                    self.add(cloud, implied, f"implied by {trigger}: {reason}")


# --- walking one provider file -------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    name: str  # the method name called (attribute)
    owner: str | None  # the attribute right before it (``x.virtual_machines.get`` -> "virtual_machines")
    args: tuple[ast.expr, ...]
    where: str
    node: ast.Call  # "providers/aws.py:AwsProvider.launch"


def _calls(tree: ast.Module, rel: str) -> Iterator[_Call]:
    """Every ``<expr>.<name>(...)`` call with the qualified name of the function containing it."""

    def visit(node: ast.AST, scope: list[str], aliases: dict[str, str]) -> Iterator[_Call]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, [*scope, child.name], dict(aliases))
                continue
            if isinstance(child, ast.Assign) and isinstance(child.value, ast.Attribute):
                for target in child.targets:
                    if isinstance(target, ast.Name | ast.Attribute):
                        aliases[ast.unparse(target)] = child.value.attr
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute):
                base = child.func.value
                owner = base.attr if isinstance(base, ast.Attribute) else aliases.get(ast.unparse(base))
                where = f"{rel}:{'.'.join(scope) or '<module>'}"
                yield _Call(child.func.attr, owner, tuple(child.args), where, child)
            yield from visit(child, scope, aliases)

    yield from visit(tree, [], {})


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _strings(tree: ast.Module) -> set[str]:
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _source_mentions(tree: ast.Module, *words: str) -> bool:
    text = ast.unparse(tree)
    return any(w in text for w in words)


# --- boto3 -> IAM ------------------------------------------------------------------------------------


@functools.cache
def _boto_operations(service: str) -> tuple[str, dict[str, str]]:
    """(IAM prefix, {snake_case method: OperationName}) from botocore's service model."""
    import botocore.session
    from botocore import xform_name

    model = botocore.session.get_session().get_service_model(service)
    prefix = model.metadata.get("signingName") or model.endpoint_prefix
    return prefix, {xform_name(op): op for op in model.operation_names}


_BOTO_CANDIDATES = ("ec2", "pricing", "sts")


def _scan_boto3(tree: ast.Module, rel: str, scan: Scan) -> None:
    if not any(i.split(".")[0] in {"boto3", "botocore"} for i in _imports(tree)):
        return
    services = [s for s in _BOTO_CANDIDATES if s in _strings(tree)] or ["ec2"]
    methods: dict[str, str] = {}
    for service in reversed(services):  # the first service named wins a shared method name
        prefix, ops = _boto_operations(service)
        methods.update({snake: f"{prefix}:{op}" for snake, op in ops.items()})
    for call in _calls(tree, rel):
        if call.name in methods and call.name not in _GENERIC_NAMES:
            scan.add("aws", methods[call.name], call.where)
        elif call.name in {"get_paginator", "get_waiter"} and call.args:
            arg = call.args[0]
            if isinstance(arg, ast.Constant) and arg.value in methods:
                scan.add("aws", methods[arg.value], call.where)


# Client methods every boto3 client has that are not API operations.
_GENERIC_NAMES = frozenset({"close", "get_paginator", "get_waiter", "can_paginate", "generate_presigned_url"})


# --- libcloud drivers: method -> what it sends -----------------------------------------------------


def _module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{module} is not installed. To fix: install the project's dev extra.")
    return Path(spec.origin)


@functools.cache
def _class_methods(module: str) -> dict[str, dict[str, ast.FunctionDef]]:
    tree = ast.parse(_module_path(module).read_text())
    return {
        node.name: {f.name: f for f in node.body if isinstance(f, ast.FunctionDef)}
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def _mro_methods(module: str, chain: tuple[str, ...]) -> dict[str, ast.FunctionDef]:
    """Methods of a class given as its chain (most derived first) inside one libcloud module."""
    classes = _class_methods(module)
    merged: dict[str, ast.FunctionDef] = {}
    for cls in reversed(chain):
        merged.update(classes.get(cls, {}))
    return merged


def _unpassed(fn: ast.FunctionDef, call: ast.Call | None) -> set[str]:
    """Parameters with a None/False default that a call site leaves out."""
    if call is None:
        return set()
    args = fn.args
    positional = [a.arg for a in args.posonlyargs + args.args][1:]  # without self
    given = set(positional[: len(call.args)]) | {k.arg for k in call.keywords if k.arg}
    if any(k.arg is None for k in call.keywords):  # **kwargs: anything may be passed
        return set()
    defaults = dict(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
    return {
        name
        for name, d in defaults.items()
        if name not in given and isinstance(d, ast.Constant) and d.value in (None, False)
    }


def _reachable(fn: ast.FunctionDef, unpassed: set[str]) -> list[ast.AST]:
    """The statements of ``fn``, minus the bodies of ``if <param>:`` branches on parameters left unpassed.

    Design choice: only this one, very common shape of optional work (``if auth: import the key``) is pruned,
    so what remains is an over-approximation of what the call can do, never an under-approximation."""

    def walk(stmts: list[ast.stmt]) -> Iterator[ast.AST]:
        for st in stmts:
            if isinstance(st, ast.If):
                names = {n.id for n in ast.walk(st.test) if isinstance(n, ast.Name)}
                yield st.test
                if not (names and names <= unpassed):
                    yield from walk(st.body)
                yield from walk(st.orelse)
            else:
                yield st

    return list(walk(fn.body))


def _self_calls(nodes: list[ast.AST]) -> set[str]:
    out: set[str] = set()
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                    out.add(node.func.attr)
    return out


def _closure(
    methods: dict[str, ast.FunctionDef], start: str, call: ast.Call | None = None
) -> list[list[ast.AST]]:
    """Statement lists of ``start`` (pruned by what ``call`` leaves out) and of every method it reaches."""
    if start not in methods:
        return []
    first = _reachable(methods[start], _unpassed(methods[start], call))
    out = [first]
    seen = {start}
    todo = list(_self_calls(first))
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        out.append(list(methods[name].body))
        todo.extend(_self_calls(out[-1]))
    return out


_EC2_CHAIN = ("EC2NodeDriver", "BaseEC2NodeDriver")


def _ec2_actions(*roots: ast.AST) -> set[str]:
    """``"Action": "X"`` dict entries and ``params["Action"] = "X"`` assignments under the given nodes."""
    actions: set[str] = set()
    for node in (n for root in roots for n in ast.walk(root)):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if isinstance(k, ast.Constant) and k.value == "Action" and isinstance(v, ast.Constant):
                    actions.add(str(v.value))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if (
                    isinstance(t, ast.Subscript)
                    and isinstance(t.slice, ast.Constant)
                    and t.slice.value == "Action"
                ):
                    actions.add(str(node.value.value))
    return actions


def _ec2_method_actions(method: str, call: ast.Call | None) -> set[str]:
    methods = _mro_methods("libcloud.compute.drivers.ec2", _EC2_CHAIN)
    out: set[str] = set()
    for body in _closure(methods, method, call):
        out |= _ec2_actions(*body)
    return out


def _scan_libcloud_ec2(tree: ast.Module, rel: str, scan: Scan) -> None:
    if not _source_mentions(tree, "EC2NodeDriver", "Provider.EC2", "libcloud.compute.drivers.ec2"):
        return
    methods = _mro_methods("libcloud.compute.drivers.ec2", _EC2_CHAIN)
    for call in _calls(tree, rel):
        if call.name in methods and not call.name.startswith("_"):
            for action in _ec2_method_actions(call.name, call.node):
                scan.add("aws", f"ec2:{action}", f"{call.where} -> libcloud EC2NodeDriver.{call.name}")
    for action in _ec2_actions(tree):  # requests the adapter builds itself on a driver subclass
        scan.add("aws", f"ec2:{action}", f"{rel} (own EC2 query request)")


# --- libcloud GCE: REST path + HTTP method -> IAM permission ----------------------------------------

_GCE_CHAIN = ("GCENodeDriver",)
_SCOPES_2 = {"zones", "regions", "projects"}
_SCOPES_1 = {"global", "aggregated"}


def _template(node: ast.expr) -> str | None:
    """The path template of a request argument with every placeholder as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.sub(r"%[sd]", "{}", node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)  # type: ignore[misc]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _template(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _template(node.func.value)
    return None


def gce_permission(path: str, http_method: str) -> str | None:
    """Map one Compute Engine REST request to its IAM permission (None: not a compute resource path)."""
    segs = [s for s in path.split("?")[0].strip("/").split("/") if s]
    aggregated = False
    while segs:
        if segs[0] in _SCOPES_2 and len(segs) > 2:
            segs = segs[2:]
        elif segs[0] in _SCOPES_1:
            aggregated = aggregated or segs[0] == "aggregated"
            segs = segs[1:]
        else:
            break
    if not segs or not re.fullmatch(r"[a-zA-Z]+", segs[0]):
        return None
    collection = segs[0]
    if len(segs) == 1:
        if collection.startswith("set") and not aggregated:  # project-level custom verb
            return f"compute.projects.{collection}"
        verb = "create" if http_method == "POST" else "list"
    elif len(segs) == 2:
        verb = {"GET": "get", "DELETE": "delete", "PUT": "update", "PATCH": "update"}.get(http_method, "get")
    elif segs[1] == "family":
        verb = "getFromFamily"
    else:
        verb = _GCE_CUSTOM_VERBS.get(segs[2], segs[2])
    if not re.fullmatch(r"[a-zA-Z]+", verb):
        return None
    return f"compute.{collection}.{verb}"


# REST paths whose method (and so IAM permission) is not the path segment (Compute API reference).
_GCE_CUSTOM_VERBS = {"serialPort": "getSerialPortOutput", "guestAttributes": "getGuestAttributes",
                     "screenshot": "getScreenshot"}


def _assigned_paths(nodes: list[ast.AST], methods: dict[str, ast.FunctionDef]) -> dict[str, set[str]]:
    """Variable -> path templates assigned to it; ``request, body = self._x_req(...)`` takes the first
    element of what ``_x_req`` returns."""
    assigned: dict[str, set[str]] = {}
    for node in (n for root in nodes for n in ast.walk(root)):
        if not isinstance(node, ast.Assign):
            continue
        tpl = _template(node.value)
        for t in node.targets:
            if tpl is not None and tpl.startswith("/") and isinstance(t, ast.Name):
                assigned.setdefault(t.id, set()).add(tpl)
            elif (
                isinstance(t, ast.Tuple)
                and t.elts
                and isinstance(t.elts[0], ast.Name)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr in methods
            ):
                assigned.setdefault(t.elts[0].id, set()).update(_returned_paths(methods, node.value.func.attr))
    return assigned


def _returned_paths(methods: dict[str, ast.FunctionDef], name: str) -> set[str]:
    fn = methods[name]
    local = _assigned_paths([fn], {})
    out: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and node.value.elts:
            first = node.value.elts[0]
            if isinstance(first, ast.Name):
                out |= local.get(first.id, set())
            elif (tpl := _template(first)) is not None:
                out.add(tpl)
    return out


def _gce_requests(nodes: list[ast.AST], methods: dict[str, ast.FunctionDef]) -> set[tuple[str, str]]:
    """(path template, HTTP method) of every request sent from the given statements."""
    assigned = _assigned_paths(nodes, methods)
    out: set[tuple[str, str]] = set()
    for node in (n for root in nodes for n in ast.walk(root)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        if name == "request_aggregated_items" and node.args:
            tpl = _template(node.args[0])
            if tpl:
                out.add((f"/aggregated/{tpl}", "GET"))
            continue
        if name not in {"request", "async_request"} or not node.args:
            continue
        if not (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "connection"):
            continue
        method = "GET"
        for kw in node.keywords:
            if kw.arg == "method" and isinstance(kw.value, ast.Constant):
                method = str(kw.value.value)
        arg = node.args[0]
        paths = assigned.get(arg.id, set()) if isinstance(arg, ast.Name) else {t for t in [_template(arg)] if t}
        out.update((p, method) for p in paths)
    return out


def _gce_method_permissions(method: str, call: ast.Call | None) -> set[str]:
    methods = _mro_methods("libcloud.compute.drivers.gce", _GCE_CHAIN)
    out: set[str] = set()
    for body in _closure(methods, method, call):
        for path, http in _gce_requests(body, methods):
            perm = gce_permission(path, http)
            if perm:
                out.add(perm)
    return out


def _scan_libcloud_gce(tree: ast.Module, rel: str, scan: Scan) -> None:
    if not _source_mentions(tree, "GCENodeDriver", "Provider.GCE", "libcloud.compute.drivers.gce"):
        return
    methods = _mro_methods("libcloud.compute.drivers.gce", _GCE_CHAIN)
    for call in _calls(tree, rel):
        if call.name in methods and not call.name.startswith("_"):
            for perm in _gce_method_permissions(call.name, call.node):
                scan.add("gcp", perm, f"{call.where} -> libcloud GCENodeDriver.{call.name}")
    # REST calls the adapter sends itself through the driver's connection (e.g. a label-filtered
    # ``GET /aggregated/instances``): direct ones, and those through a helper that forwards its path parameter.
    for path, http in _gce_requests([tree], {}):
        perm = gce_permission(path, http)
        if perm:
            scan.add("gcp", perm, f"{rel} -> GCE REST {http} {path}")
    forwarders: dict[str, str] = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        params = [a.arg for a in fn.args.args]
        for node in ast.walk(fn):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "request" and node.args and isinstance(node.args[0], ast.Name)
                    and node.args[0].id in params
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "connection"):
                method = "GET"
                for kw in node.keywords:
                    if kw.arg == "method" and isinstance(kw.value, ast.Constant):
                        method = str(kw.value.value)
                forwarders[fn.name] = method
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in forwarders and node.args):
            tpl = _template(node.args[0])
            perm = gce_permission(tpl, forwarders[node.func.attr]) if tpl else None
            if perm:
                scan.add("gcp", perm, f"{rel}:{node.lineno} -> GCE REST {forwarders[node.func.attr]} {tpl}")


# --- azure-mgmt-compute -> Azure RBAC actions ----------------------------------------------------------


# The ARM SDKs the adapters use, and the client class name each is reported as.
AZURE_SDKS = (("azure.mgmt.compute", "ComputeManagementClient"), ("azure.mgmt.network", "NetworkManagementClient"),
              ("azure.mgmt.resource.resources", "ResourceManagementClient"))


@functools.cache
def _azure_compute(
    module: str = "azure.mgmt.compute",
) -> tuple[dict[str, str], dict[str, dict[str, ast.FunctionDef]], dict[str, tuple[str, str]]]:
    """(client attribute -> operations class, class -> methods, build function -> (HTTP method, URL)) of one
    ARM SDK (compute by default)."""
    base = _module_path(module).parent
    client = ast.parse((base / "_client.py").read_text())
    groups: dict[str, str] = {}
    for node in ast.walk(client):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id.endswith("Operations")
        ):
            for t in node.targets:
                if isinstance(t, ast.Attribute):
                    groups[t.attr] = node.value.func.id
    ops = ast.parse((base / "operations" / "_operations.py").read_text())
    classes = {
        n.name: {f.name: f for f in n.body if isinstance(f, ast.FunctionDef)}
        for n in ops.body
        if isinstance(n, ast.ClassDef)
    }
    builds: dict[str, tuple[str, str]] = {}
    for fn in ops.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("build_")):
            continue
        url = method = None
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "_url" for t in targets):
                    url = str(node.value.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "HttpRequest":
                for kw in node.keywords:
                    if kw.arg == "method" and isinstance(kw.value, ast.Constant):
                        method = str(kw.value.value)
        if url and method:
            builds[fn.name] = (method, url)
    return groups, classes, builds


def azure_action(http_method: str, url: str) -> str:
    """Azure RBAC action of one ARM request: ``GET /subscriptions/{s}/providers/Microsoft.Compute/skus`` ->
    ``Microsoft.Compute/skus/read``; a POST to ``.../{name}/<verb>`` -> ``.../<verb>/action``."""
    verbs = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}
    if "/providers/" not in url and re.search(r"/resourcegroups/\{[^}]+\}$", url, re.IGNORECASE):
        return f"Microsoft.Resources/subscriptions/resourceGroups/{verbs[http_method]}"  # Microsoft.Resources
    tail = url.split("/providers/", 1)[1].strip("/").split("/")
    namespace, rest = tail[0], tail[1:]
    types = [seg for i, seg in enumerate(rest) if i % 2 == 0]
    ends_with_name = len(rest) % 2 == 0
    if http_method == "POST" and not ends_with_name:
        return "/".join([namespace, *types[:-1], types[-1], "action"])
    verb = {"GET": "read", "HEAD": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}[http_method]
    return "/".join([namespace, *types, verb])


def _azure_operation_requests(cls: str, method: str, module: str = "azure.mgmt.compute") -> set[tuple[str, str]]:
    groups, classes, builds = _azure_compute(module)
    methods = classes.get(cls, {})
    out: set[tuple[str, str]] = set()
    for body in _closure(methods, method):
        for node in (n for root in body for n in ast.walk(root)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in builds:
                out.add(builds[node.func.id])
    return out


def _scan_azure(tree: ast.Module, rel: str, scan: Scan) -> None:
    imports = _imports(tree)
    if not any(i.startswith("azure.mgmt.") for i in imports):
        return
    sdks = [(m, c) for m, c in AZURE_SDKS if any(i.startswith(m) for i in imports)]
    for call in _calls(tree, rel):
        for module, client in sdks:
            groups, classes, _ = _azure_compute(module)
            if call.owner in groups and call.name in classes.get(groups[call.owner], {}):
                for http, url in _azure_operation_requests(groups[call.owner], call.name, module):
                    action = azure_action(http, url)
                    scan.add("azure", action, f"{call.where} -> {client}.{call.owner}.{call.name}")
                    if "/resourceGroups/" in url or "/resourcegroups/" in url:
                        scan.azure_resource_group_scoped.add(action)
                break


# --- entry point ---------------------------------------------------------------------------------------


def _provider_files(providers_dir: Path) -> Iterable[Path]:
    return sorted(p for p in providers_dir.rglob("*.py") if "__pycache__" not in p.parts)


def scan_providers(providers_dir: Path) -> Scan:
    """Scan every module under ``providers_dir``; paths in the result are relative to its parent."""
    scan = Scan()
    for path in _provider_files(providers_dir):
        rel = path.relative_to(providers_dir.parent).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        scan.files.append(rel)
        _scan_boto3(tree, rel, scan)
        _scan_libcloud_ec2(tree, rel, scan)
        _scan_libcloud_gce(tree, rel, scan)
        _scan_azure(tree, rel, scan)
    scan.finish()
    return scan


def _markdown(scan: Scan, cloud: str) -> str:
    lines = ["| permission | needed by |", "|---|---|"]
    for perm in sorted(scan.permissions[cloud]):
        lines.append(f"| `{perm}` | {'<br>'.join(sorted(scan.permissions[cloud][perm]))} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a helper for README updates
    root = Path(__file__).resolve().parents[2]
    result = scan_providers(root / "providers")
    for cloud in sys.argv[1:] or CLOUDS:
        print(f"## {cloud}\n\n{_markdown(result, cloud)}\n")
