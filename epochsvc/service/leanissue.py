"""``POST /v1/epochs`` answered outside the framework's frames, when nothing about it is wrong.

Issuing is the path the operator's admissions wait on, and PostgreSQL commits eight issues in
about 3 ms. What is left per issue is Python under one interpreter lock: about fifteen
Starlette and FastAPI frames (middleware, router, dependency solving, response validation),
0.64-0.74 ms of the event loop's time per issue against 0.4 ms for a whole lookup. Issuing
topped out near half the rate of in-memory lookups. So an issue whose every part is right is
answered here, before the framework, by the same definitions the route uses:

- the credential, by :func:`~epochsvc.service.auth.caller_of` and
  :func:`~epochsvc.service.auth.operator_only`, which the route's ``Operator`` dependency calls
  too (a refusal is counted and logged once, and answered by the app's own handler);
- the body, by :class:`~mcp_epoch.api.IssueRequest`, validated from the parsed JSON as FastAPI
  validates it;
- the issue, by :func:`~epochsvc.service.issued.issue_one`, which the route calls too;
- the answer, rendered by the same ``JSONResponse`` and observed under the route's own path;
- errors the issue raises (a store that is down), by the app's own exception handlers.

Everything else is the framework's to answer, so no refusal is written twice. A request this
path does not take (another path or method, no ``Content-Length``, a body over the limit, not
``application/json``, JSON that does not parse or does not validate) goes to the app untouched,
its body replayed if it was read. Nothing was issued by then: the credential check is the only
step before, and it changes nothing but the refusal counter, which the app's own check would
count again only for a credential the lean path accepted.
"""

from __future__ import annotations

import json
import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from epochsvc.service.auth import caller_of, operator_only
from epochsvc.service.deps import is_json
from epochsvc.service.errors import answer_by_handlers
from epochsvc.service.issued import issue_one
from mcp_epoch.api import IssueRequest


class LeanIssue:
    """Outermost layer: a right ``POST /v1/epochs`` is issued here; every other request, and
    every issue this path does not take, runs through ``app`` as always."""

    def __init__(self, app: ASGIApp, service: FastAPI) -> None:
        self.app = app
        self.service = service
        # The route's own path (raises if the app has none): the lean path answers for it.
        self.path = service.url_path_for("issue_epoch")
        self.max_bytes: int = service.state.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"] != self.path
            or scope.get("root_path")
        ):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated field, as Starlette reads
        declared = headers.get(b"content-length", b"")
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if not declared.isdigit() or int(declared) > self.max_bytes or not is_json(ctype):
            await self.app(scope, receive, send)
            return
        body = await self._read(receive)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            await self._to_app(scope, receive, send, body)
            return
        state = self.service.state
        scope["app"] = self.service
        status: int | None = 500
        try:
            operator_only(
                await caller_of(state, headers.get(b"authorization", b"").decode("latin-1"))
            )
            try:
                request = IssueRequest.model_validate(parsed)
            except ValidationError:
                status = None  # the app answers, and observes, the route's own refusal
                await self._to_app(scope, receive, send, body)
                return
            epoch, created = await issue_one(state.store, state.notifier, state.metrics, request)
            response = JSONResponse(
                epoch.model_dump(mode="json", by_alias=True), status_code=201 if created else 200
            )
            await response(scope, receive, send)
            status = response.status_code
        except Exception as exc:
            status = await answer_by_handlers(
                self.service.exception_handlers, exc, scope, receive, send
            )
        finally:
            if status is not None:
                state.metrics.observe("POST", self.path, status, started)

    async def _read(self, receive: Receive) -> bytes:
        """The body, as declared (the server frames it by ``Content-Length``)."""
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client left; the app's own reading will see it too
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _to_app(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        """The app answers as if nothing had read the request: its body is replayed first."""
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
