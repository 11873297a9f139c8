"""The documented shapes of the ``/v1`` API's answers and the job-spec body example (OpenAPI only).

The routes build their answers as plain dicts (the hot paths serialize with orjson); these models give the
schema in ``/openapi.json`` and ``/docs`` their real fields. ``tests/broker/test_api_docs.py`` checks real
answers against them, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ErrorOut",
    "WhoAmIOut",
    "NamespaceOut",
    "NamespacesOut",
    "TokenCreatedOut",
    "TokenOut",
    "TokensOut",
    "TokenRevokedOut",
    "JobOut",
    "JobsOut",
    "JobListOut",
    "OptionOut",
    "JobDetailOut",
    "PreviewOut",
    "OfferOut",
    "OffersOut",
    "JOB_SPEC_EXAMPLE",
    "JOB_BODY",
    "ERROR",
    "ERRORS",
    "documented",
]

# A job spec as a new user writes it (the body example of POST .../jobs and of the preview).
JOB_SPEC_EXAMPLE: dict[str, Any] = {
    "apiVersion": "hybrid-broker/v1",
    "kind": "Job",
    "metadata": {"name": "cpu-batch", "labels": {"team": "ml"}},
    "spec": {
        "command": ["python", "-c", "print('crunch')"],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
        "durationHours": 3,
        "placement": {"providers": ["aws", "azure", "gcp"], "spot": "never"},
    },
}

_SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"type": "string", "enum": ["hybrid-broker/v1"]},
        "kind": {"type": "string", "enum": ["Job"]},
        "metadata": {"type": "object", "description": "name (required), namespace, labels"},
        "spec": {"type": "object", "description": "command, resources.requests, durationHours, placement, "
                 "data, deadline ... (docs/JOBSPEC.md)"},
    },
}

JOB_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "One job spec (docs/JOBSPEC.md), a list of job specs (a burst, all or nothing), or "
        '`{"jobs": [...]}`; JSON or YAML (`Content-Type: application/yaml`).',
        "content": {
            "application/json": {
                "schema": {"oneOf": [_SPEC_SCHEMA, {"type": "array", "items": _SPEC_SCHEMA}]},
                "example": JOB_SPEC_EXAMPLE,
            },
            "application/yaml": {
                "schema": {"type": "string"},
                "example": "apiVersion: hybrid-broker/v1\nkind: Job\nmetadata: {name: cpu-batch}\nspec:\n"
                "  command: [python, -c, \"print('crunch')\"]\n  resources:\n    requests: {cpu: \"4\", "
                "memory: 16Gi}\n  durationHours: 3\n",
            },
        },
    }
}


class ErrorOut(BaseModel):
    """Every error answer: what is wrong and how to fix it, and the offending field when there is one."""

    detail: str = Field(examples=["spec.resources.requests.cpu: '-1' is not a CPU quantity. To fix: ..."])
    field: str | None = Field(default=None, examples=["spec.resources.requests.cpu"])


ERROR: dict[str, Any] = {"model": ErrorOut, "description": "error (JSON with `detail`)"}
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {**ERROR, "description": "missing, unknown or revoked token"},
    404: {**ERROR, "description": "no such namespace (or not the token's) or object"},
    413: {**ERROR, "description": "body too large"},
    422: {**ERROR, "description": "invalid input; `field` names it"},
}


def documented(model: type[BaseModel], status: int = 200, *more: int) -> dict[int | str, Any]:
    """``responses=`` of a route answering ``model`` at ``status``, the usual errors and the ``more`` codes."""
    return {status: {"model": model, "description": model.__doc__ or "OK"}, **ERRORS, **{c: ERROR for c in more}}


class WhoAmIOut(BaseModel):
    """Who the token belongs to."""

    admin: bool
    namespace: str | None = Field(description="the token's namespace; null for the admin token")
    token_id: str


class NamespaceOut(BaseModel):
    """A namespace."""

    name: str = Field(examples=["team-a"])
    created_at: str | None


class NamespacesOut(BaseModel):
    """The namespaces the token may see (all of them for the admin token)."""

    namespaces: list[NamespaceOut]


class TokenCreatedOut(BaseModel):
    """A new token; the secret `token` is shown only in this answer."""

    id: str
    namespace: str
    token: str
    created_at: str | None


class TokenOut(BaseModel):
    """A token without its secret."""

    id: str
    namespace: str
    description: str | None
    created_at: str | None
    revoked_at: str | None


class TokensOut(BaseModel):
    """A namespace's tokens, without secrets."""

    tokens: list[TokenOut]


class TokenRevokedOut(BaseModel):
    """The revoked token."""

    id: str
    namespace: str
    revoked_at: str | None


_STATES = ["PENDING", "HELD", "PROVISIONING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]


class JobOut(BaseModel):
    """A job (the submit answer for one spec, and each item of a list)."""

    model_config = ConfigDict(extra="allow")

    id: str
    name: str = Field(examples=["cpu-batch"])
    namespace: str = Field(examples=["team-a"])
    state: str = Field(examples=["PENDING"], description="one of " + ", ".join(_STATES))
    priority: int
    created_at: str | None
    updated_at: str | None = None
    provider: str | None = Field(default=None, examples=["aws"])
    region: str | None = Field(default=None, examples=["us-east-1"])
    dry_run: bool = Field(default=False, description="true when the provider only simulates the run")
    held_reason: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class JobsOut(BaseModel):
    """The jobs of a burst, in the order submitted (a body with several specs)."""

    jobs: list[JobOut]


class JobListOut(BaseModel):
    """A page of jobs in submission order; pass `next_cursor` as `cursor` for the next page."""

    jobs: list[JobOut]
    next_cursor: str | None


class OptionOut(BaseModel):
    """Where a job runs and what it costs (the OPTION object of `broker place --json`)."""

    provider: str = Field(examples=["gcp"])
    region: str = Field(examples=["us-central1"])
    zone: str | None
    instance_type: str = Field(examples=["n2-standard-4"])
    capacity: str = Field(examples=["on-demand"])
    vcpus: float
    memory_gib: float
    gpus: int
    accelerator: str | None
    hourly_usd: float
    compute_usd: float
    egress_usd: float
    transfer_hours: float
    total_usd: float
    interruption_usd: float = Field(default=0.0, description="spot only: expected cost of interruptions")


class JobDetailOut(JobOut):
    """One job in full: its spec, placement and cost, instances, provisioning attempts and events."""

    spec: dict[str, Any]
    placement: OptionOut | None
    cost: dict[str, float | None] | None
    instances: list[Any]
    retries: int | None = None
    message: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    not_before: str | None = None
    cancel_requested_at: str | None = None  # a cancel waits for the replica that runs the job (202)
    attempts: list[dict[str, Any]]
    events: list[dict[str, Any]]


class PreviewOut(BaseModel):
    """Where the job would run (nothing is submitted): the JSON of `broker place --json`."""

    job: str
    placement: OptionOut | None
    alternatives: list[OptionOut]
    considered: int
    feasible: int
    rejected: dict[str, int] = Field(description="offers rejected, by reason")
    explanation: str = Field(description="why the placement won over the runner-up (or why nothing fits)")


class OfferOut(BaseModel):
    """An offer of the catalog or the on-prem pool."""

    provider: str
    region: str
    zone: str | None
    site: str
    instance_type: str
    vcpus: float
    memory_gib: float
    gpus: int
    accelerator: str | None
    arch: str | None
    capacity: str
    hourly_usd: float


class OffersOut(BaseModel):
    """Offers cheapest first, and how many matched in all."""

    catalog_version: str
    total: int
    offers: list[OfferOut]
