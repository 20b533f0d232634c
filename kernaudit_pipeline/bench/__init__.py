"""The GPU runner (``kernaudit bench``), its statistics, peak ceilings and profiler captures.

Everything under this package imports only torch, triton, numpy and the standard library
(plus ``kernaudit_pipeline.kernel_spec``), because it runs on GPU hosts that have nothing else.
"""
