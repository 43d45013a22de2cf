"""``POST /v1/epochs`` on the real service (uvicorn on loopback, SQLite), through its lean path
(:mod:`epochsvc.service.leanissue`) and through the framework's route, side by side on one app:
the same request gets the same answer either way, byte for byte; every right issue is taken by
the lean path; and everything else gets exactly the route's answer, counted once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from epochsvc.service.app import ServiceApp, create_app
from epochsvc.service.settings import Settings
from tests.support.metrics import sample
from tests.support.served import served

OPERATOR = "o" * 32
REPLICA = "r" * 32
MAX_BODY = 1024


class Both:
    """One service, served twice: ``lean`` as it runs (its front), ``framework`` without the
    lean path. ``through`` lists the paths the front handed on to the framework."""

    def __init__(self, app: ServiceApp, lean: str, framework: str, through: list[str]) -> None:
        self.app, self.lean, self.framework, self.through = app, lean, framework, through

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("headers", {"authorization": f"Bearer {OPERATOR}"})
        return httpx.post(f"{url}/v1/epochs", **kwargs)

    def metrics(self) -> str:
        return httpx.get(f"{self.lean}/metrics").text


@contextmanager
def _both(tmp_path: Path) -> Iterator[Both]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        auth="static",
        operator_token=OPERATOR,
        replica_token=REPLICA,
        max_body_bytes=MAX_BODY,
    )
    app = create_app(settings)
    front = app.front
    framework = front.app
    through: list[str] = []

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            through.append(scope["path"])
        await framework(scope, receive, send)

    front.app = counted  # instrumentation only: the real framework still answers
    with served(front) as lean, served(framework, lifespan="off") as direct:
        yield Both(app, lean, direct, through)


def _issue(uid: str) -> dict[str, str]:
    return {"namespace": "ns", "server": "srv", "request_uid": uid}


def _head(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k not in ("date", "server")}


def test_an_issue_is_answered_as_the_route_answers_it(tmp_path: Path) -> None:
    with _both(tmp_path) as both:
        made = both.post(both.lean, json=_issue("a"))
        repeat = both.post(both.framework, json=_issue("a"))
        assert (made.status_code, repeat.status_code) == (201, 200)
        assert made.content == repeat.content and _head(made) == _head(repeat)
        first = made.json()["epoch"]
        # And the other way round: the route issues, the lean path answers the repeat.
        made = both.post(both.framework, json=_issue("b"))
        repeat = both.post(both.lean, json=_issue("b"))
        assert (made.status_code, repeat.status_code) == (201, 200)
        assert made.content == repeat.content and _head(made) == _head(repeat)
        assert made.json()["epoch"] != first
        # The lean path took every issue sent through the front.
        assert "/v1/epochs" not in both.through
        text = both.metrics()
        route = {"method": "POST", "route": "/v1/epochs"}
        count = "epochsvc_request_duration_seconds_count"
        assert sample(text, count, status="201", **route) == 2.0
        assert sample(text, count, status="200", **route) == 2.0
        issued = sample(text, "epochsvc_epochs_issued_total", namespace="ns", server="srv")
        assert issued == 2.0  # repeats are not counted, whichever path answered them


def _chunked() -> Iterator[bytes]:
    yield b'{"namespace": "ns", "server": "srv", '
    yield b'"request_uid": "chunked"}'


BEARER = {"authorization": f"Bearer {OPERATOR}"}
AS_JSON = {"content-type": "application/json"}

#: Each refused request, and the code of ``epochsvc_auth_refused_total`` it counts (or None).
REFUSED: dict[str, tuple[dict[str, Any], str | None]] = {
    # Without a bearer token there is nothing to verify: 401, not a refused credential.
    "no credentials": ({"headers": {}, "json": _issue("x")}, None),
    "not a bearer token": (
        {"headers": {"authorization": "Basic b3A6b3A="}, "json": _issue("x")},
        None,
    ),
    "a token of nobody": (
        {"headers": {"authorization": "Bearer " + "z" * 32}, "json": _issue("x")},
        "forbidden",
    ),
    "the replica's token": (
        {"headers": {"authorization": f"Bearer {REPLICA}"}, "json": _issue("x")},
        None,  # a credential of someone, not the operator: refused by the route, not counted
    ),
    "not JSON by its type": (
        {"content": b'{"namespace": "ns"}', "headers": {**BEARER, "content-type": "text/plain"}},
        None,
    ),
    "truncated JSON": ({"content": b'{"namespace": "ns"', "headers": {**BEARER, **AS_JSON}}, None),
    "JSON, not an object": ({"json": ["ns", "srv", "x"]}, None),
    "an unknown field": ({"json": {**_issue("x"), "generation": 7}}, None),
    "a number for a name": ({"json": {**_issue("x"), "namespace": 7}}, None),
    "a malformed name": ({"json": {**_issue("x"), "server": "Not_A_Name"}}, None),
    "a missing field": ({"json": {"namespace": "ns", "server": "srv"}}, None),
    "a body over the limit": ({"json": _issue("x" * MAX_BODY)}, None),
    # A repeated field is read as Starlette reads it: the first one.
    "the replica's token, then the operator's": (
        {
            "json": _issue("x"),
            "headers": [("authorization", f"Bearer {REPLICA}"), *BEARER.items()],
        },
        None,
    ),
    "bad JSON and no credentials": ({"content": b"{", "headers": AS_JSON}, None),
    "a bad body and a token of nobody": (
        {"json": {"namespace": 7}, "headers": {"authorization": "Bearer " + "z" * 32}},
        "forbidden",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_issue_gets_the_routes_own_answer(tmp_path: Path, case: str) -> None:
    request, counted = REFUSED[case]
    with _both(tmp_path) as both:
        before = both.metrics()
        via_front = both.post(both.lean, **request)
        after = both.metrics()
        direct = both.post(both.framework, **request)
        assert via_front.status_code in (401, 403, 413, 415, 422), via_front.text
        assert (via_front.status_code, via_front.content) == (direct.status_code, direct.content)
        assert _head(via_front) == _head(direct)
        # A refused credential is counted once, as the route alone counts it.
        for code in ("forbidden", "auth-unavailable"):
            was = sample(before, "epochsvc_auth_refused_total", code=code) or 0.0
            now = sample(after, "epochsvc_auth_refused_total", code=code) or 0.0
            assert now == was + (code == counted), code
        listed = httpx.get(f"{both.lean}/v1/servers/ns/srv/epochs", headers=BEARER).json()
        assert listed["epochs"] == []  # nothing was issued by a refused request


def test_a_chunked_issue_is_the_routes_to_take(tmp_path: Path) -> None:
    with _both(tmp_path) as both:
        r = both.post(
            both.lean,
            content=_chunked(),
            headers={**BEARER, **AS_JSON},
        )
        assert r.status_code == 201 and r.json()["generation"] == 1
        assert both.through.count("/v1/epochs") == 1
