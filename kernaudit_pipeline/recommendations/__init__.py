"""The ``recommendations`` stage: one decision per (kernel, shape, device), a short review queue,
learned block-size heuristics, and the human sign-off and vLLM export that follow them.

Modules, dependencies pointing up the list (toward ``core``):

- ``model``: the records and their JSON schema (and the advisor's structured-output type);
- ``limits``: device limits and occupancy as the rules see them;
- ``ranking``: one rule picks each group's config (ties broken by a stated criterion) and decides;
- ``rules``: per-config diagnoses and the per-group review queue;
- ``heuristics``: block-size heuristics learned from the sweep;
- ``verify``: the one Verifier (one compile budget, one memo);
- ``advisor``: the Claude client (prompt, ``messages.parse``, usage), depending on ``model`` only;
- ``advice``: what Claude is shown, and its answer screened and verified;
- ``stage``: the asset's single entry point, :func:`stage.run`;
- ``review``: the hash-chained, content-bound sign-off trail; ``export``: vLLM config files.

Nothing is imported here: ``import kernaudit_pipeline.recommendations.stage`` (or the module you
need) keeps the CLI light.
"""
