"""Who is calling (authentication), as FastAPI dependencies.

Two modes (``EPOCHSVC_AUTH``):

- ``kubernetes`` (the chart's): every caller presents a projected ServiceAccount token for
  the audience ``mcp-epoch``. The operator is one named ServiceAccount; every other accepted
  token must be bound to a pod, and that pod may act only for itself (see :mod:`.access`).
- ``static``: two shared tokens, operator and replica, for running outside a cluster. A
  replica token cannot say which pod holds it, so it is trusted less: it never sees pod UIDs
  and must name the bound pod's UID to register an incarnation.

Static tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Depends, Request

from epochsvc.service.errors import ApiError
from epochsvc.service.identity import PodIdentity, ReviewUnavailable, TokenReviewer

log = logging.getLogger("epochsvc.auth")


class Role(StrEnum):
    OPERATOR = "operator"
    POD = "pod"  # a pod-bound ServiceAccount token: acts only for that pod
    REPLICA = "replica"  # the static shared replica token


@dataclass(frozen=True, slots=True)
class Caller:
    role: Role
    pod: PodIdentity | None = None

    @property
    def is_operator(self) -> bool:
        return self.role is Role.OPERATOR


@dataclass(frozen=True)
class Tokens:
    operator: str
    replica: str

    def role_of(self, presented: str) -> Role | None:
        given = presented.encode()
        # Check both, always: the time taken does not tell which one matched.
        is_op = hmac.compare_digest(given, self.operator.encode())
        is_rep = hmac.compare_digest(given, self.replica.encode())
        if is_op:
            return Role.OPERATOR
        if is_rep:
            return Role.REPLICA
        return None


@dataclass(frozen=True)
class KubernetesAuth:
    reviewer: TokenReviewer
    #: ``system:serviceaccount:<namespace>:<name>`` of the operator.
    operator_username: str


Authenticator = Tokens | KubernetesAuth

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="mcp-epoch"'}


def _refused(detail: str) -> ApiError:
    log.warning("refused a credential: %s", detail)
    return ApiError(403, "forbidden", "the bearer token is not valid for this service")


async def authenticate(auth: Authenticator, token: str) -> Caller:
    """The caller a bearer token stands for; 403 for one that stands for nobody here."""
    if isinstance(auth, Tokens):
        role = auth.role_of(token)
        if role is None:
            raise _refused("no static token matched")
        return Caller(role)
    try:
        who = await auth.reviewer.review(token)
    except ReviewUnavailable as exc:
        raise ApiError(
            503,
            "auth-unavailable",
            f"cannot verify the token now ({exc}); retry shortly",
            {"Retry-After": "1"},
        ) from None
    if who is None:
        raise _refused("TokenReview: not an accepted ServiceAccount token for this audience")
    if who.username == auth.operator_username:
        return Caller(Role.OPERATOR, who.pod)
    if who.pod is None:
        raise _refused(f"{who.username} is neither the operator nor bound to a pod")
    return Caller(Role.POD, who.pod)


async def caller(request: Request) -> Caller:
    return await caller_of(request.app.state, request.headers.get("authorization", ""))


async def caller_of(state: Any, authorization: str) -> Caller:
    """The caller an ``Authorization`` header stands for, with ``state`` the app's (its
    ``auth`` and its ``metrics``, which count a refusal): 401 without a bearer token, 403 for
    one that stands for nobody here."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "unauthenticated",
            "missing credentials: send 'Authorization: Bearer <token>' (in a cluster, the "
            "pod's projected ServiceAccount token for the audience mcp-epoch)",
            _CHALLENGE,
        )
    try:
        return await authenticate(state.auth, token.strip())
    except ApiError as exc:
        state.metrics.auth_refused.labels(exc.code).inc()
        raise


def operator_only(who: Caller) -> Caller:
    """403 unless ``who`` is the operator."""
    if not who.is_operator:
        raise ApiError(403, "forbidden", "this call is the operator's")
    return who


async def require_operator(who: Annotated[Caller, Depends(caller)]) -> Caller:
    return operator_only(who)


AnyCaller = Annotated[Caller, Depends(caller)]
Operator = Annotated[Caller, Depends(require_operator)]
