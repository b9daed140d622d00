"""The operator's controller: its kopf wiring (`operator`), the level-triggered reconcile of a TritonModel
(`reconcile`, `errors`) over its watch cache (`cache`), the warm-up gate (`gate`), in-place reloads (`reload`) and
heals (`heal`).

It talks to the API server through `platform` and starts the `servers` every replica exposes; the decisions are
the pure planner's (`plan`).
"""
