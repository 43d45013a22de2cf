"""Bearer-token dependencies: the operator may do everything, replicas may register
incarnations and read. Tokens are compared in constant time."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from fastapi import Depends, Request

from epochsvc.service.errors import ApiError


class Role(StrEnum):
    OPERATOR = "operator"
    REPLICA = "replica"


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


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="mcp-epoch"'}


async def caller_role(request: Request) -> Role:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "unauthenticated",
            "missing credentials: send 'Authorization: Bearer <operator or replica token>'",
            _CHALLENGE,
        )
    tokens: Tokens = request.app.state.tokens
    role = tokens.role_of(token.strip())
    if role is None:
        raise ApiError(403, "forbidden", "the bearer token is not valid for this service")
    return role


async def require_operator(role: Annotated[Role, Depends(caller_role)]) -> Role:
    if role is not Role.OPERATOR:
        raise ApiError(403, "forbidden", "this call needs the operator token")
    return role


AnyCaller = Annotated[Role, Depends(caller_role)]
Operator = Annotated[Role, Depends(require_operator)]
