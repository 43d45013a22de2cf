"""What each caller may do (authorization), as plain functions the routers call.

- The operator may do everything and is the only caller shown pod UIDs.
- A pod (a pod-bound ServiceAccount token) may register incarnations only for the epoch bound
  to itself, and read only the epochs of its own server, which it learns from that binding.
- The static replica token cannot tell pods apart: it may read, never sees a pod UID, and
  registers an incarnation only by naming the UID of the pod the epoch is bound to.
"""

from __future__ import annotations

from dataclasses import replace

from epochsvc.service.auth import Caller, Role
from epochsvc.service.errors import ApiError
from epochsvc.service.lifecycle import TOMBSTONES
from epochsvc.service.store.base import EpochRecord, EpochStore, UnknownEpoch

#: A pod's binding never changes (one epoch per pod, its UID bound once), so which epoch is a
#: pod's is kept; its state is read afresh each time. The bound on entries only caps memory.
_BINDINGS_MAX = 65536


class Access:
    def __init__(self, store: EpochStore) -> None:
        self.store = store
        self._bindings: dict[str, int] = {}  # pod UID -> generation of its epoch

    async def own_epoch(self, caller: Caller) -> EpochRecord | None:
        """The epoch bound to the calling pod, as the ledger holds it now."""
        assert caller.pod is not None
        uid = caller.pod.uid
        generation = self._bindings.get(uid)
        if generation is None:
            record = await self.store.bound_to(uid)
            if record is None:
                return None
            if len(self._bindings) >= _BINDINGS_MAX:
                self._bindings.clear()
            self._bindings[uid] = record.generation
            return record
        try:
            return await self.store.get(generation)
        except UnknownEpoch:  # compacted long after the pod retired
            return None

    async def check_read(self, caller: Caller, namespace: str, server: str) -> None:
        if caller.role is not Role.POD:
            return
        own = await self.own_epoch(caller)
        if own is None:
            raise ApiError(
                403,
                "not-bound",
                "no epoch is bound to the calling pod yet; retry once the operator has "
                "seen the pod",
                {"Retry-After": "1"},
            )
        _refuse_retired(own)
        if (own.namespace, own.server) != (namespace, server):
            raise ApiError(403, "forbidden", "a pod may read only its own server's epochs")

    async def check_ring_read(self, caller: Caller, namespace: str, server: str) -> None:
        """A server's request-state keys go to its own pods only. The operator drives
        rotations without ever seeing a key; the static replica token stands for every
        replica of a local run, so it may load any server's ring."""
        if caller.role is Role.OPERATOR:
            raise ApiError(
                403,
                "forbidden",
                "request-state keys are served only to the server's own pods; the operator "
                "reads a ring's status at /v1/servers/{namespace}/{server}/request-state",
            )
        await self.check_read(caller, namespace, server)

    async def check_own_epoch(self, caller: Caller, generation: int) -> None:
        """A pod acts only for the epoch bound to itself."""
        if caller.role is not Role.POD:
            return
        own = await self.own_epoch(caller)
        if own is None or own.generation != generation:
            raise ApiError(403, "not-your-epoch", "a pod may report only for its own epoch")
        _refuse_retired(own)

    async def incarnation_uid(self, caller: Caller, named_uid: str | None) -> str | None:
        """The pod UID a registration must match (None: the operator, which need not)."""
        if caller.role is Role.OPERATOR:
            return named_uid
        if caller.role is Role.POD:
            assert caller.pod is not None
            if named_uid is not None and named_uid != caller.pod.uid:
                raise ApiError(403, "not-your-epoch", "a pod may register only for itself")
            own = await self.own_epoch(caller)
            if own is not None:
                _refuse_retired(own)
            return caller.pod.uid
        if named_uid is None:
            raise ApiError(
                422,
                "pod-uid-required",
                "with the shared replica token, send the pod's own UID as pod_uid",
            )
        return named_uid


def _refuse_retired(own: EpochRecord) -> None:
    """The pod is gone: refused at once, although the API server may accept its token for a
    few seconds more (it caches token reviews too)."""
    if own.state in TOMBSTONES:
        raise ApiError(403, "forbidden", "the calling pod's epoch has retired")


def shown(record: EpochRecord, caller: Caller) -> EpochRecord:
    """The record as this caller may see it: pod UIDs only for the operator."""
    if caller.is_operator or record.pod_uid is None:
        return record
    return replace(record, pod_uid=None)
