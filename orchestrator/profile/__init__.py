"""The machine's measured rates: a short job per GPU type and node layout (``gpudays profile``) times the matrix
products, attention, memory copies and collectives the step-time model is built from, and keeps them as one JSON
record per hardware identity in a sweep folder's ``profiles/`` (:mod:`orchestrator.store.paths`).

``identity`` says which hardware a profile is of, ``record`` reads, writes and finds profiles, ``matmul``,
``attention``, ``memory`` and ``collectives`` measure (each timed as ``timing`` says), ``runner`` starts the
ranks and puts a profile together, and ``rates`` reads what the step-time model needs from one.
"""
