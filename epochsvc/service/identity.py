"""Who is calling: a projected ServiceAccount token, verified by the API server (TokenReview).

The API server is the only party that can say a token is still good: it checks the signature,
the expiry, the audience *and* that the pod the token is bound to still exists with the same
UID. So a deleted pod's token fails here although its signature is fine, which a local check
against the issuer's keys could not see. Answers are cached briefly (keyed by a hash of the
token, never the token) so that a long-polling fleet costs the API server one review per pod
per cache period. The API server caches its own answers too (10 s), so a deleted pod's token
is refused here within the two periods, or at once once its epoch retires (see ``access``).

Only ``httpx`` (already a dependency) is used: one POST does not justify the synchronous
``kubernetes`` client and its thread per call on this async service.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("epochsvc.identity")

IN_CLUSTER_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SA_PREFIX = "system:serviceaccount:"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
CACHE_ENTRIES = 4096


class ReviewUnavailable(RuntimeError):
    """The API server could not be asked: the caller answers 503 and the client retries."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Reviewed:
    """A token the API server accepted: its ServiceAccount, and the pod it is bound to."""

    namespace: str
    service_account: str
    pod: PodIdentity | None

    @property
    def username(self) -> str:
        return f"{SA_PREFIX}{self.namespace}:{self.service_account}"


def parse_review(status: dict[str, Any], audience: str) -> Reviewed | None:
    """The identity in a TokenReview status, or None if the token does not stand for one.

    Only ServiceAccount tokens count, and only those whose audiences include ours: a token the
    API server accepts for itself is not a token for this service.
    """
    if status.get("authenticated") is not True:
        return None
    if audience not in (status.get("audiences") or []):
        return None
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    if not username.startswith(SA_PREFIX):
        return None
    namespace, _, account = username[len(SA_PREFIX) :].partition(":")
    if not namespace or not account:
        return None
    extra = user.get("extra") or {}
    names, uids = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
    pod = PodIdentity(namespace, str(names[0]), str(uids[0])) if names and uids else None
    return Reviewed(namespace, account, pod)


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim (epoch seconds) of a JWT, read without verifying it: used only to
    keep a cached answer no longer than the token itself lives, after the API server has
    verified it."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, int | float) else None


@dataclass(frozen=True, slots=True)
class ApiServer:
    """How this service reaches the API server: in a pod, from its own mounted account."""

    url: str
    ca_file: str | None
    token_file: str

    @classmethod
    def discover(cls, url: str | None, ca_file: str | None, token_file: str | None) -> ApiServer:
        """Explicit settings win; else the in-cluster environment; else a clear error."""
        if not url:
            host, port = (
                os.environ.get("KUBERNETES_SERVICE_HOST"),
                os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
            )
            if not host:
                raise ValueError(
                    "EPOCHSVC_AUTH=kubernetes verifies tokens with the Kubernetes API server, "
                    "but none is known: not in a cluster and EPOCHSVC_KUBE_API_URL is unset. "
                    "Outside a cluster set EPOCHSVC_AUTH=static to use shared tokens"
                )
            url = f"https://{f'[{host}]' if ':' in host else host}:{port}"
        if ca_file is None and (IN_CLUSTER_DIR / "ca.crt").exists():
            ca_file = str(IN_CLUSTER_DIR / "ca.crt")
        token_file = token_file or str(IN_CLUSTER_DIR / "token")
        if not Path(token_file).is_file():
            raise ValueError(
                f"cannot read the service's own ServiceAccount token at {token_file}: it is "
                "needed to create TokenReviews (set EPOCHSVC_KUBE_TOKEN_FILE)"
            )
        return cls(url.rstrip("/"), ca_file, token_file)


class TokenReviewer:
    """Verifies bearer tokens with ``POST /apis/authentication.k8s.io/v1/tokenreviews``."""

    def __init__(
        self,
        api: ApiServer,
        audience: str,
        *,
        cache_seconds: float = 10.0,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.api = api
        self.audience = audience
        self.cache_seconds = cache_seconds
        verify: Any = api.ca_file or True
        self._client = httpx.AsyncClient(
            base_url=api.url, timeout=timeout, verify=verify, transport=transport
        )
        self._cache: OrderedDict[str, tuple[float, Reviewed | None]] = OrderedDict()
        #: TokenReviews sent (cache misses), for tests and metrics.
        self.reviews = 0

    def _own_token(self) -> str:
        # Read each time: the kubelet rotates the service's own projected token as well.
        return Path(self.api.token_file).read_text().strip()

    async def review(self, token: str) -> Reviewed | None:
        """The caller's identity, None for a token that stands for nobody here."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        result = await self._ask(token)
        life = self.cache_seconds
        exp = token_expiry(token)
        if exp is not None:
            life = min(life, exp - time.time())
        if life > 0:
            self._cache[key] = (now + life, result)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return result

    async def _ask(self, token: str) -> Reviewed | None:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self.audience]},
        }
        self.reviews += 1
        try:
            own = self._own_token()
            resp = await self._client.post(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                json=body,
                headers={"Authorization": f"Bearer {own}"},
            )
        except (OSError, httpx.HTTPError) as exc:
            log.error("cannot verify a token: the API server did not answer: %r", exc)
            raise ReviewUnavailable(f"the Kubernetes API server did not answer: {exc}") from exc
        if resp.status_code != 201 and resp.status_code != 200:
            # 401/403 here mean *this service* lacks the right to review tokens: loud, since
            # every caller is now refused until someone fixes the RBAC.
            log.error(
                "TokenReview refused with %s: the epoch service needs 'create' on "
                "authentication.k8s.io/tokenreviews: %s",
                resp.status_code,
                resp.text[:300],
            )
            raise ReviewUnavailable(f"TokenReview answered {resp.status_code}")
        try:
            status = resp.json().get("status") or {}
        except ValueError as exc:
            raise ReviewUnavailable("TokenReview answered with no JSON") from exc
        return parse_review(status, self.audience)

    async def close(self) -> None:
        await self._client.aclose()
