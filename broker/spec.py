"""Job specs: the Kubernetes-shaped YAML/JSON document of ``docs/JOBSPEC.md``, parsed into :class:`JobSpec`.

Contract:

* :func:`parse_job_spec` takes a mapping, or YAML/JSON text, and returns a validated :class:`JobSpec`, or raises
  :class:`~broker.errors.SpecError` whose ``field`` is the dotted path of the first wrong field and whose
  message says what is wrong and how to fix it. It never raises anything else for bad input.
* Quantities are parsed as Kubernetes does (``500m``, ``1.5``, ``32Gi``, ``512M``, ``1e3``); ``32GB`` is refused
  with a hint, because Kubernetes refuses it too.
* YAML is read with a loader that refuses documents over :data:`MAX_DOCUMENT_BYTES`, more than
  :data:`MAX_ALIASES` alias references (YAML bombs) or more than :data:`MAX_NODES` nodes, so parsing is
  bounded in time and memory.
* Unknown fields are errors (a typo must not silently change a placement).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

from broker.errors import SpecError
from broker.model import (
    Arch,
    CheckpointSpec,
    DataInput,
    JobSpec,
    Objective,
    Request,
    RetryPolicy,
    SpotPolicy,
)

__all__ = [
    "API_VERSION",
    "KNOWN_PROVIDERS",
    "KNOWN_ACCELERATORS",
    "MAX_DOCUMENT_BYTES",
    "parse_quantity",
    "parse_cpu",
    "parse_memory_gib",
    "parse_job_spec",
    "validate_labels",
    "load_documents",
    "load_spec_file",
    "spec_to_dict",
    "specs_from_payload",
    "normalize_accelerator",
]

API_VERSION = "hybrid-broker/v1"
MAX_DOCUMENT_BYTES = 1 << 20
MAX_ALIASES = 100
MAX_NODES = 20_000

KNOWN_PROVIDERS = ("aws", "azure", "gcp", "onprem", "edge", "slurm", "ray")

# Accelerator models a job may name (case-insensitive). The catalog decides where each is offered; this list
# only catches typos early. Aliases map to the canonical name used by the catalogs.
KNOWN_ACCELERATORS: Mapping[str, str] = {
    name.lower(): name
    for name in (
        "A100", "A100-80GB", "A10", "A10G", "A16", "A40", "B100", "B200", "B300", "GB200", "H100", "H100-MEGA",
        "H200", "K80", "L4", "L40", "L40S", "M60", "MI300X", "P100", "P4", "P40", "RTX6000", "RTXPRO6000",
        "T4", "T4g", "V100", "V100-32GB", "Radeon-Pro-V520", "Gaudi", "Gaudi2", "Inferentia", "Inferentia2",
        "Trainium", "Trainium2", "tpu-v2-8", "tpu-v3-8", "tpu-v4-8", "tpu-v5e-1", "tpu-v5e-4", "tpu-v5e-8",
        "tpu-v5p-8", "tpu-v6e-1", "tpu-v6e-4", "tpu-v6e-8", "NVIDIA-A100", "NVIDIA-T4",
    )
}
_ACCELERATOR_ALIASES = {"nvidia-a100": "A100", "nvidia-t4": "T4", "a100-40gb": "A100", "a10g": "A10G"}

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_GPU_KEYS = ("nvidia.com/gpu", "amd.com/gpu", "gpu")

# Bounds that catch absurd values (a typo of units, usually) with a clear error instead of a silent no-fit.
MAX_VCPUS = 4096.0
MAX_MEMORY_GIB = 64 * 1024.0
MAX_GPUS = 64
MAX_NODES_PER_JOB = 1024
MAX_DURATION_HOURS = 24 * 366.0
MAX_DATA_GIB = 10 * 1024.0**2  # 10 PiB

_TOP_KEYS = {"apiVersion", "kind", "metadata", "spec"}
_META_KEYS = {"name", "namespace", "labels", "annotations"}
_SPEC_KEYS = {
    "priorityClassName", "priority", "queue", "command", "args", "image", "env", "workingDir", "resources",
    "nodes", "durationHours", "deadline", "data", "placement", "retry", "checkpoint",
    "activeDeadlineSeconds",  # the run's time limit (Kubernetes' name); edge tasks are killed at it
    "livenessProbe", "readinessProbe",  # issue 14: validated by broker.ops.probes
    "restartPolicy",  # OnFailure (default) | Never: what a failed liveness probe does (restart, or FAILED)
    "verticalScaling",  # {updateMode: Off | Initial, minAllowed}: VPA recommendations at submission (issue 14)
}
RESTART_POLICIES = ("OnFailure", "Never")
VPA_UPDATE_MODES = ("Off", "Initial")
_VPA_KEYS = {"updateMode", "minAllowed"}
_RESOURCES_KEYS = {"requests", "limits", "accelerator", "arch"}
_RESOURCE_NAMES = {"cpu", "memory", *_GPU_KEYS, "ephemeral-storage"}
_DATA_KEYS = {"uri", "location", "sizeGiB"}
_PLACEMENT_KEYS = {
    "providers", "regions", "nodeSelector", "spot", "maxHourlyUSD", "objective", "sameZone", "interconnect",
    "includeOutliers", "burstable",
}
_RETRY_KEYS = {"backoffLimit", "retryDelaySeconds", "maxRetryDelaySeconds"}
_CHECKPOINT_KEYS = {"path", "intervalMinutes"}


# --------------------------------------------------------------------------------------------- quantities


def parse_quantity(value: object, field: str) -> float:
    """A Kubernetes quantity as a plain number (``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824.0)."""
    if isinstance(value, bool):
        raise SpecError(field, f"expected a quantity such as 8 or 500m, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        m = _QUANTITY_RE.match(text)
        if not m:
            hint = ""
            low = text.lower()
            for bad, good in (("gb", "Gi"), ("mb", "Mi"), ("tb", "Ti"), ("kb", "Ki"), ("gib", "Gi"), ("mib", "Mi")):
                if low.endswith(bad) and low[: -len(bad)].replace(".", "", 1).isdigit():
                    hint = f"; did you mean {text[: -len(bad)]}{good}?"
                    break
            raise SpecError(
                field, f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 32Gi, 512Mi){hint}"
            )
        number = float(m.group(1))
        if m.group(2):
            number *= 10.0 ** int(m.group(2)[1:])
        elif m.group(3):
            suffix = m.group(3)
            number *= _BINARY.get(suffix) or _DECIMAL[suffix]
    else:
        raise SpecError(field, f"expected a quantity such as 8, 500m or 32Gi, got {type(value).__name__}")
    if not math.isfinite(number):
        raise SpecError(field, f"{value!r} is not a finite quantity")
    if number < 0:
        raise SpecError(field, f"{value!r} is negative; quantities must be >= 0")
    return number


def parse_cpu(value: object, field: str) -> float:
    """CPU cores from a quantity (``"500m"`` -> 0.5)."""
    cores = parse_quantity(value, field)
    if 0 < cores < 0.001:
        raise SpecError(field, f"{value!r} is less than the smallest CPU request (1m = 0.001). To fix: ask "
                               "for at least 1m, or 0")
    if cores > MAX_VCPUS:
        raise SpecError(field, f"{value!r} asks for {cores:g} vCPUs; the most a job may ask is {MAX_VCPUS:g}")
    return cores


def parse_memory_gib(value: object, field: str) -> float:
    """Memory in GiB from a quantity. A bare number is bytes, as in Kubernetes."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 4096:
        raise SpecError(
            field, f"{value!r} without a unit means {value} bytes; write {value}Gi for GiB (or 512Mi, 32Gi)"
        )
    gib = parse_quantity(value, field) / 2**30
    if gib > MAX_MEMORY_GIB:
        raise SpecError(field, f"{value!r} is {gib:g} GiB; the most a job may ask is {MAX_MEMORY_GIB:g} GiB")
    return gib


def _parse_gpus(value: object, field: str) -> int:
    n = parse_quantity(value, field)
    if n != int(n):
        raise SpecError(field, f"{value!r}: GPUs are whole devices")
    if n > MAX_GPUS:
        raise SpecError(field, f"{value!r} GPUs per node is more than any machine has (max {MAX_GPUS})")
    return int(n)


def normalize_accelerator(name: str, field: str = "spec.resources.accelerator") -> str:
    """The canonical accelerator name (``a100`` -> ``A100``); raises SpecError for an unknown model."""
    key = name.strip().lower()
    if key in _ACCELERATOR_ALIASES:
        return _ACCELERATOR_ALIASES[key]
    if key in KNOWN_ACCELERATORS:
        return KNOWN_ACCELERATORS[key]
    raise SpecError(
        field,
        f"unknown accelerator {name!r}. To fix: use one of "
        + ", ".join(sorted({v for v in KNOWN_ACCELERATORS.values() if not v.startswith(("NVIDIA", "tpu"))})),
    )


# ---------------------------------------------------------------------------------------------- YAML input


SPEC_TOP_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses YAML bombs: few aliases, and a bound on the node count *as expanded*
    (an alias counts as every node of what it refers to), so no later walk over the result can blow up."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._expanded = 0
        self._sizes: dict[int, int] = {}
        self._document_root: Any = None

    def _size(self, node: yaml.Node) -> int:
        key = id(node)
        if key in self._sizes:
            return self._sizes[key]
        self._sizes[key] = 1  # guards against recursive structures
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(self._size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(self._size(k) + self._size(v) for k, v in node.value)
        self._sizes[key] = total
        return total

    def compose_node(self, parent: Any, index: Any) -> Any:  # PyYAML hook
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise SpecError("", f"the document uses more than {MAX_ALIASES} YAML aliases; refused (YAML bomb?)")
            anchor = self.peek_event().anchor
            if anchor in self.anchors:
                self._expanded += self._size(self.anchors[anchor])
        else:
            self._expanded += 1
        if self._expanded > MAX_NODES:
            raise SpecError("", f"the document expands to more than {MAX_NODES} YAML nodes; refused (YAML bomb?)")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # PyYAML hook
        """Refuse a key given twice in one mapping (YAML would keep the last silently); merge keys (``<<``)
        may still be overridden, as YAML says."""
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the constructor reports it
                    continue
                if first is None:
                    seen[key] = key_node.start_mark.line
                else:
                    hint = (" (two job specs in one file? To fix: put a line '---' between them)"
                            if key in SPEC_TOP_KEYS and node is self._document_root else
                            ". To fix: keep one of them")
                    mark = key_node.start_mark
                    raise SpecError("", f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1} "
                                        f"(first at line {first + 1}){hint}")
        return super().construct_mapping(node, deep)

    def construct_document(self, node: Any) -> Any:  # PyYAML hook
        self._document_root = node
        return super().construct_document(node)


def load_documents(text: str | bytes) -> list[Any]:
    """Every YAML (or JSON) document in ``text``; a top-level list counts as one document per item."""
    if isinstance(text, bytes):
        if len(text) > MAX_DOCUMENT_BYTES:
            raise SpecError("", f"the document is {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError("", f"the document is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if len(text) > MAX_DOCUMENT_BYTES:
        raise SpecError("", f"the document is {len(text)} characters; the limit is {MAX_DOCUMENT_BYTES}")
    docs: list[Any] = []
    try:
        loader = _BoundedLoader(text)
        try:
            while loader.check_node():
                node = loader.get_node()
                docs.append(loader.construct_document(node))
        finally:
            loader.dispose()
    except SpecError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise SpecError("", f"malformed YAML{where}: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise SpecError("", f"malformed YAML: {exc}") from None
    except RecursionError:
        raise SpecError("", "the document nests too deeply") from None
    out: list[Any] = []
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, list):
            out.extend(doc)
        else:
            out.append(doc)
    return out


def load_spec_file(path: str | Path, *, now: datetime | None = None,
                   location_exists: Callable[[str], bool] | None = None) -> list[JobSpec]:
    """Every job spec in a YAML/JSON file (several ``---`` documents or a list are a burst)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise SpecError(str(p), f"the file is {size} bytes; the limit is {MAX_DOCUMENT_BYTES}")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SpecError(str(p), "no such file") from None
    except IsADirectoryError:
        raise SpecError(str(p), "is a directory, not a job spec file") from None
    except PermissionError:
        raise SpecError(str(p), "cannot be read (permission denied)") from None
    try:
        docs = load_documents(raw)
        if not docs:
            raise SpecError("", "the file holds no job spec")
        prefix = len(docs) > 1
        return [
            parse_job_spec(doc, now=now, location_exists=location_exists, _path=f"[{i}]." if prefix else "")
            for i, doc in enumerate(docs)
        ]
    except SpecError as exc:  # the error names the file (a command may read several)
        named = SpecError(exc.field, exc.message)
        named.args = (f"{p}: {exc}",)
        raise named from None


# -------------------------------------------------------------------------------------------- validation


def _mapping(value: object, field: str, allowed: set[str] | None = None) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(field, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise SpecError(field, f"keys must be strings, got {key!r}")
        if allowed is not None and key not in allowed:
            raise SpecError(
                f"{field}.{key}" if field else key,
                f"unknown field. To fix: use one of {', '.join(sorted(allowed))}",
            )
    return value


def _str(value: object, field: str, *, max_len: int = 1024) -> str:
    if not isinstance(value, str):
        raise SpecError(field, f"expected a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise SpecError(field, f"longer than {max_len} characters")
    if "\x00" in value:
        raise SpecError(field, "contains a NUL character, which no store or process accepts. To fix: remove it")
    return value


# Kubernetes label syntax: a name (<= 63: alphanumerics, '-', '_', '.', alphanumeric at both ends) with an
# optional DNS-subdomain prefix (<= 253) and '/'; a value is empty or a name.
_LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_LABELS = 64


def validate_labels(value: object, field: str, *, allow_null: bool = False) -> dict[str, str | None]:
    """Kubernetes-style labels (``key: value``, at most :data:`MAX_LABELS`): a key is ``[prefix/]name`` with
    ``name`` of 1-63 alphanumerics, ``-``, ``_``, ``.`` (alphanumeric at both ends) and ``prefix`` a DNS
    subdomain of at most 253; a value is empty or like a name. Numbers and booleans are taken as their text.
    ``allow_null`` admits ``None`` values (a merge patch's "remove this label")."""
    raw = _mapping(value, field)
    if len(raw) > MAX_LABELS:
        raise SpecError(field, f"{len(raw)} labels; at most {MAX_LABELS} are allowed")
    out: dict[str, str | None] = {}
    for k, v in raw.items():
        prefix, _, name = k.rpartition("/")
        if not _LABEL_NAME_RE.match(name) or (prefix and (len(prefix) > 253 or not _LABEL_PREFIX_RE.match(prefix))):
            raise SpecError(f"{field}.{k}", "invalid label key. To fix: use [prefix/]name, name 1-63 characters "
                            "of a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric (e.g. site/zone)")
        if v is None and allow_null:
            out[k] = None
            continue
        text = str(v).lower() if isinstance(v, bool) else str(v) if isinstance(v, int | float) else v
        if not isinstance(text, str) or (text and not _LABEL_NAME_RE.match(text)):
            raise SpecError(f"{field}.{k}", f"invalid label value {v!r}. To fix: use at most 63 characters of "
                            "a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric, or empty")
        out[k] = text
    return out


def _str_list(value: object, field: str, *, max_items: int = 1000) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        raise SpecError(field, "expected a list of strings, e.g. [python, train.py]")
    if not isinstance(value, list):
        raise SpecError(field, f"expected a list, got {type(value).__name__}")
    if len(value) > max_items:
        raise SpecError(field, f"more than {max_items} items")
    return tuple(_str(v, f"{field}[{i}]") if not isinstance(v, int | float) or isinstance(v, bool)
                 else str(v) for i, v in enumerate(value))


def _number(value: object, field: str, *, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise SpecError(field, f"expected a number, got {value!r}") from None
        else:
            raise SpecError(field, f"expected a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < lo or number > hi:
        raise SpecError(field, f"{value!r} is out of range [{lo:g}, {hi:g}]")
    if integer and number != int(number):
        raise SpecError(field, f"{value!r} must be a whole number")
    return number


def _bool(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field, f"expected true or false, got {value!r}")
    return value


def _deadline(value: object, field: str, now: datetime) -> datetime:
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise SpecError(field, f"{value!r} is not an ISO 8601 time such as 2026-12-03T06:00:00Z") from None
    else:
        raise SpecError(field, f"expected an ISO 8601 time, got {type(value).__name__}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    if dt <= now:
        raise SpecError(field, f"{dt.isoformat()} is in the past (now is {now.isoformat(timespec='seconds')})")
    return dt


def _location(value: object, field: str, location_exists: Callable[[str], bool] | None) -> str:
    text = _str(value, field, max_len=200).strip()
    provider, sep, region = text.partition(":")
    if not sep or not provider or not region:
        raise SpecError(field, f"{text!r} is not of the form provider:region (e.g. aws:us-east-1)")
    if provider not in KNOWN_PROVIDERS:
        raise SpecError(field, f"unknown provider {provider!r} in {text!r}; use one of {', '.join(KNOWN_PROVIDERS)}")
    if location_exists is not None and not location_exists(text):
        raise SpecError(field, f"location {text!r} does not exist in the catalog or the on-prem inventory")
    return text


def _json_safe(value: Any) -> Any:
    t = type(value)
    if t is str or t is int or t is bool or value is None:  # most values: as they are (the checks below agree)
        return value
    if t is dict:
        return {k if type(k) is str else str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, datetime):
        v = value if value.tzinfo else value.replace(tzinfo=UTC)
        return v.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _resources(value: object, field: str) -> dict[str, float]:
    res = _mapping(value, field, _RESOURCE_NAMES)
    out: dict[str, float] = {}
    for key, raw in res.items():
        sub = f"{field}.{key}"
        if key == "cpu":
            out["cpu"] = parse_cpu(raw, sub)
        elif key == "memory":
            out["memory"] = parse_memory_gib(raw, sub)
        elif key == "ephemeral-storage":
            out["ephemeral-storage"] = parse_quantity(raw, sub) / 2**30
        else:
            out["gpu"] = float(_parse_gpus(raw, sub))
    return out


def parse_job_spec(
    doc: Mapping[str, Any] | str | bytes,
    *,
    now: datetime | None = None,
    location_exists: Callable[[str], bool] | None = None,
    default_namespace: str | None = None,
    _path: str = "",
) -> JobSpec:
    """Validate one job spec document and return it as a :class:`JobSpec`.

    ``now`` (UTC, default the current time) judges deadlines; ``location_exists`` (optional) is asked whether
    each data input's ``provider:region`` is a real place. Raises :class:`SpecError` naming the field.
    """
    if isinstance(doc, str | bytes):
        docs = load_documents(doc)
        if len(docs) != 1:
            raise SpecError("", f"expected one job spec document, found {len(docs)}")
        doc = docs[0]
    now = now or datetime.now(UTC)
    p = _path

    if not isinstance(doc, Mapping):
        raise SpecError(p.rstrip(".") or "document", f"a job spec must be a mapping, got {type(doc).__name__}")
    top = _mapping(doc, p.rstrip("."), _TOP_KEYS)
    api_version = top.get("apiVersion", API_VERSION)
    if api_version != API_VERSION:
        raise SpecError(f"{p}apiVersion", f"{api_version!r} is not supported; use {API_VERSION}")
    kind = top.get("kind", "Job")
    if kind != "Job":
        raise SpecError(f"{p}kind", f"{kind!r}: expected Job")

    meta = _mapping(top.get("metadata"), f"{p}metadata", _META_KEYS)
    if "name" not in meta:
        raise SpecError(f"{p}metadata.name", "required: a DNS-1123 name such as train-1")
    name = _str(meta["name"], f"{p}metadata.name", max_len=63)
    if not _NAME_RE.match(name):
        raise SpecError(
            f"{p}metadata.name", f"{name!r} must be lowercase letters, digits and '-', at most 63 characters"
        )
    namespace = meta.get("namespace", default_namespace)
    if namespace is not None:
        namespace = _str(namespace, f"{p}metadata.namespace", max_len=63)
        if not _NAME_RE.match(namespace):
            raise SpecError(f"{p}metadata.namespace", f"{namespace!r} is not a valid namespace name")
    labels_raw = _mapping(meta.get("labels"), f"{p}metadata.labels")
    if len(labels_raw) > 64:
        raise SpecError(f"{p}metadata.labels", "more than 64 labels")
    labels = {_str(k, f"{p}metadata.labels", max_len=317):
              _str(v, f"{p}metadata.labels.{k}", max_len=63) if not isinstance(v, int | float | bool)
              else _str(str(v).lower() if isinstance(v, bool) else str(v), f"{p}metadata.labels.{k}", max_len=63)
              for k, v in labels_raw.items()}

    if "spec" not in top:
        raise SpecError(f"{p}spec", "required")
    spec = _mapping(top["spec"], f"{p}spec", _SPEC_KEYS)
    sp = f"{p}spec"

    command = _str_list(spec.get("command"), f"{sp}.command") + _str_list(spec.get("args"), f"{sp}.args")
    image = _str(spec["image"], f"{sp}.image", max_len=512) if spec.get("image") is not None else None
    env_raw = _mapping(spec.get("env"), f"{sp}.env")
    env: dict[str, str] = {}
    for k, v in env_raw.items():
        if isinstance(v, Mapping | list):
            raise SpecError(f"{sp}.env.{k}", "environment values must be strings or numbers")
        _str(k, f"{sp}.env", max_len=1024)
        env[k] = _str("" if v is None else str(v).lower() if isinstance(v, bool) else str(v), f"{sp}.env.{k}",
                      max_len=MAX_DOCUMENT_BYTES)
    workdir = _str(spec["workingDir"], f"{sp}.workingDir") if spec.get("workingDir") is not None else None

    resources = _mapping(spec.get("resources"), f"{sp}.resources", _RESOURCES_KEYS)
    requests = _resources(resources.get("requests"), f"{sp}.resources.requests")
    limits = _resources(resources.get("limits"), f"{sp}.resources.limits")
    for key in ("cpu", "memory", "gpu"):
        if key in requests and key in limits and requests[key] > limits[key]:
            raise SpecError(
                f"{sp}.resources.requests.{key}", f"request {requests[key]:g} is above its limit {limits[key]:g}"
            )
    vcpus = requests.get("cpu", limits.get("cpu", 1.0))
    memory_gib = requests.get("memory", limits.get("memory", 2.0))
    gpus = int(limits.get("gpu", requests.get("gpu", 0)))
    if vcpus <= 0:
        raise SpecError(f"{sp}.resources.requests.cpu", "must be more than 0")
    accelerator = None
    if resources.get("accelerator") is not None:
        accelerator = normalize_accelerator(
            _str(resources["accelerator"], f"{sp}.resources.accelerator", max_len=64),
            f"{sp}.resources.accelerator",
        )
        if gpus == 0:
            gpus = 1
    arch = str(resources.get("arch", Arch.AMD64.value))
    if arch not in {a.value for a in Arch}:
        raise SpecError(f"{sp}.resources.arch", f"{arch!r}: use amd64, arm64 or any")

    nodes = int(_number(spec.get("nodes", 1), f"{sp}.nodes", lo=1, hi=MAX_NODES_PER_JOB, integer=True))
    duration = _number(spec.get("durationHours", 1.0), f"{sp}.durationHours", lo=0, hi=MAX_DURATION_HOURS)
    if duration <= 0:
        raise SpecError(f"{sp}.durationHours", "must be more than 0 hours")
    deadline = _deadline(spec["deadline"], f"{sp}.deadline", now) if spec.get("deadline") is not None else None
    if spec.get("activeDeadlineSeconds") is not None:  # kept in the raw spec; checked here
        _number(spec["activeDeadlineSeconds"], f"{sp}.activeDeadlineSeconds", lo=1, hi=MAX_DURATION_HOURS * 3600,
                integer=True)

    data_raw = spec.get("data") or []
    if not isinstance(data_raw, list):
        raise SpecError(f"{sp}.data", f"expected a list of inputs, got {type(data_raw).__name__}")
    if len(data_raw) > 100:
        raise SpecError(f"{sp}.data", "more than 100 data inputs")
    data: list[DataInput] = []
    for i, item in enumerate(data_raw):
        f = f"{sp}.data[{i}]"
        d = _mapping(item, f, _DATA_KEYS)
        for req in ("location", "sizeGiB"):
            if req not in d:
                raise SpecError(f"{f}.{req}", "required")
        uri = _str(d.get("uri", ""), f"{f}.uri", max_len=2048)
        loc = _location(d["location"], f"{f}.location", location_exists)
        size = _number(d["sizeGiB"], f"{f}.sizeGiB", lo=0, hi=MAX_DATA_GIB)
        data.append(DataInput(uri=uri, location=loc, size_gib=size))

    pl = _mapping(spec.get("placement"), f"{sp}.placement", _PLACEMENT_KEYS)
    providers = _str_list(pl.get("providers"), f"{sp}.placement.providers")
    for i, prov in enumerate(providers):
        if prov not in KNOWN_PROVIDERS:
            raise SpecError(
                f"{sp}.placement.providers[{i}]", f"unknown provider {prov!r}; use {', '.join(KNOWN_PROVIDERS)}"
            )
    regions = _str_list(pl.get("regions"), f"{sp}.placement.regions")
    node_selector = {k: v or "" for k, v in validate_labels(pl.get("nodeSelector"),
                                                            f"{sp}.placement.nodeSelector").items()}
    if node_selector:  # only edge devices carry labels: a selector confines the job to them
        if providers and "edge" not in providers:
            raise SpecError(f"{sp}.placement.nodeSelector", "selects edge devices by label, but "
                            "placement.providers leaves out edge. To fix: add edge to providers, or drop the selector")
        providers = ("edge",)
    spot_raw = pl.get("spot", SpotPolicy.NEVER.value)
    if isinstance(spot_raw, bool):  # `spot: true` reads naturally; take it as "allowed"
        spot_raw = SpotPolicy.ALLOWED.value if spot_raw else SpotPolicy.NEVER.value
    try:
        spot = SpotPolicy(str(spot_raw))
    except ValueError:
        raise SpecError(f"{sp}.placement.spot", f"{spot_raw!r}: use never, allowed or required") from None
    max_hourly = None
    if pl.get("maxHourlyUSD") is not None:
        max_hourly = _number(pl["maxHourlyUSD"], f"{sp}.placement.maxHourlyUSD", lo=0, hi=1e6)
    try:
        objective = Objective(str(pl.get("objective", Objective.COST.value)))
    except ValueError:
        raise SpecError(f"{sp}.placement.objective", f"{pl.get('objective')!r}: use cost or time") from None
    same_zone = _bool(pl["sameZone"], f"{sp}.placement.sameZone") if "sameZone" in pl else False
    interconnect = pl.get("interconnect")
    if interconnect is not None and interconnect not in ("nvlink", "nvswitch"):
        raise SpecError(f"{sp}.placement.interconnect", f"{interconnect!r}: use nvlink or nvswitch")
    include_outliers = (
        _bool(pl["includeOutliers"], f"{sp}.placement.includeOutliers") if "includeOutliers" in pl else False
    )

    burstable = pl.get("burstable", "excluded")
    if burstable not in ("allowed", "excluded"):
        raise SpecError(f"{sp}.placement.burstable", f"{burstable!r}: use allowed or excluded")

    rt = _mapping(spec.get("retry"), f"{sp}.retry", _RETRY_KEYS)
    retry = RetryPolicy(
        backoff_limit=int(_number(rt.get("backoffLimit", 6), f"{sp}.retry.backoffLimit", lo=0, hi=100,
                                  integer=True)),
        retry_delay_seconds=_number(rt.get("retryDelaySeconds", 10), f"{sp}.retry.retryDelaySeconds",
                                    lo=0, hi=86400),
        max_retry_delay_seconds=_number(rt.get("maxRetryDelaySeconds", 120),
                                        f"{sp}.retry.maxRetryDelaySeconds", lo=0, hi=86400),
    )
    checkpoint = None
    if spec.get("checkpoint") is not None:
        ck = _mapping(spec["checkpoint"], f"{sp}.checkpoint", _CHECKPOINT_KEYS)
        if "path" not in ck:
            raise SpecError(f"{sp}.checkpoint.path", "required when checkpoint is given")
        checkpoint = CheckpointSpec(
            path=_str(ck["path"], f"{sp}.checkpoint.path"),
            interval_minutes=_number(ck.get("intervalMinutes", 15), f"{sp}.checkpoint.intervalMinutes",
                                     lo=0.001, hi=10_000),
        )

    if spec.get("verticalScaling") is not None:  # applied at submission by broker.ops.vpa.autosize_doc
        vs = _mapping(spec["verticalScaling"], f"{sp}.verticalScaling", _VPA_KEYS)
        if vs.get("updateMode", "Off") not in VPA_UPDATE_MODES:
            raise SpecError(f"{sp}.verticalScaling.updateMode",
                            f"{vs.get('updateMode')!r}: use Off or Initial (requests lowered at submission)")
        floor = _resources(vs.get("minAllowed"), f"{sp}.verticalScaling.minAllowed")
        if set(floor) - {"cpu", "memory"}:
            raise SpecError(f"{sp}.verticalScaling.minAllowed", "only cpu and memory are autosized")

    # --- probes (issue 14): Kubernetes-shaped liveness/readiness probes, run by broker.ops.health ---
    from broker.ops.probes import probes_of

    probes_of(spec, sp)
    if spec.get("restartPolicy", "OnFailure") not in RESTART_POLICIES:
        raise SpecError(f"{sp}.restartPolicy", f"{spec.get('restartPolicy')!r}: use OnFailure or Never")
    # --- end probes ---

    priority = None
    if spec.get("priority") is not None:
        priority = int(_number(spec["priority"], f"{sp}.priority", lo=-(2**31), hi=10**9, integer=True))
    pcn = spec.get("priorityClassName")
    if pcn is not None:
        pcn = _str(pcn, f"{sp}.priorityClassName", max_len=253)
    queue = _str(spec["queue"], f"{sp}.queue", max_len=63) if spec.get("queue") is not None else None

    request = Request(
        name=name,
        vcpus=vcpus,
        memory_gib=memory_gib,
        gpus=gpus,
        accelerator=accelerator,
        arch=arch,
        duration_hours=duration,
        deadline=deadline,
        data=tuple(data),
        providers=providers,
        regions=regions,
        spot=spot,
        max_hourly_usd=max_hourly,
        objective=objective,
        nodes=nodes,
        same_zone=same_zone,
        interconnect=interconnect,
        include_outliers=include_outliers,
        allow_burstable=burstable == "allowed",
        node_selector=tuple(sorted(node_selector.items())),
    )
    raw = _json_safe(dict(top))
    raw.setdefault("apiVersion", API_VERSION)
    raw.setdefault("kind", "Job")
    return JobSpec(
        name=name,
        request=request,
        namespace=namespace,
        labels=labels,
        command=command,
        image=image,
        env=env,
        workdir=workdir,
        priority_class_name=pcn,
        priority=priority,
        queue=queue,
        requests=requests,
        limits=limits,
        retry=retry,
        checkpoint=checkpoint,
        raw=raw,
    )


def spec_to_dict(spec: JobSpec) -> dict[str, Any]:
    """The spec as a JSON-safe document that :func:`parse_job_spec` reads back to an equal spec
    (deadlines are kept as submitted, so re-parsing later needs ``now`` before the deadline)."""
    return json.loads(json.dumps(spec.raw))


def specs_from_payload(payload: object, *, now: datetime | None = None,
                       location_exists: Callable[[str], bool] | None = None,
                       default_namespace: str | None = None) -> list[JobSpec]:
    """Parse an API body: one spec mapping, a list of them, or ``{"jobs": [...]}``. Field paths of a burst
    start with the item index (``[3].spec.resources...``)."""
    items: Iterable[Any]
    if isinstance(payload, Mapping) and set(payload) == {"jobs"}:
        payload = payload["jobs"]
    if isinstance(payload, list):
        if not payload:
            raise SpecError("", "an empty burst: send at least one job spec")
        items = payload
        return [parse_job_spec(d, now=now, location_exists=location_exists, default_namespace=default_namespace,
                               _path=f"[{i}].") for i, d in enumerate(items)]
    if isinstance(payload, Mapping):
        return [parse_job_spec(payload, now=now, location_exists=location_exists,
                               default_namespace=default_namespace)]
    raise SpecError("", f"expected a job spec mapping or a list of them, got {type(payload).__name__}")
