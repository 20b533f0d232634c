"""Leaf modules, each the single home of its facts: ``hardware`` (SM limits, GPU specs),
``configs`` (key maps, config ids, shape dims, group key), ``values`` (NA-safe readers, JSON
cleaning), ``verdicts`` (statuses, decisions). Nothing here imports the rest of the package,
and everything here is standard library only, so the GPU runner can use it.
"""
