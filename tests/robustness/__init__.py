"""The ledger under faults: recorded histories checked for linearizability.

``python -m tests.robustness`` (``make robustness``) runs every fault at full size.
"""
