"""kernaudit: a local auditor of Triton kernel latency and memory.

This package must stay importable on a GPU host that has only torch, triton,
numpy and the standard library, so nothing heavy is imported here.
"""

__version__ = "0.1.0"
