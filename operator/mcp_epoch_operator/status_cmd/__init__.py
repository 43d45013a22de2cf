"""``mcp-epoch status`` (and ``kubectl mcp-epoch status``): one screen on one server.

Named ``status_cmd`` so it is not mistaken for :mod:`mcp_epoch_operator.status`, which builds
the ``.status`` the operator writes; this package reads that, the pods, the ledger and the
request-state ring, and reuses the same pure functions to judge them.

- :mod:`.cli`: the flags and the exit codes; imports nothing heavy (``epochsvc.cli`` builds
  its parser from it even when the operator extra is not installed);
- :mod:`.locate`: where the epoch service and the operator's credential are, read from the
  operator's Deployment (pure);
- :mod:`.gather`: every read (the API server, the epoch service, the pods' ``/metrics``);
- :mod:`.model`: what was read → the status and its problems, each with what to do (pure);
- :mod:`.render`: the status as text for a terminal, or as JSON.
"""
