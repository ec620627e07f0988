"""Client-written JSON Schemas (2020-12): checked when declared for what would make them
explode (``rules``), and run on a validator whose regexes are RE2 and whose work is bounded
(``validator``, ``bounds``, ``instance``).

- ``graph.py``: a schema as the graph of its subschemas and ``$ref`` targets.
- ``rules.py``: the ordered rules a schema passes when a flow declares it.
- ``validator.py``: the Draft 2020-12 validator with RE2 patterns, a linear ``uniqueItems``,
  no remote ``$ref`` and a deadline checked as it goes; compiled once per schema.
- ``bounds.py``: the deadline, the error cap, and where a check runs (inline, or deferred to
  a worker thread).
- ``cost.py``: what a check may cost, reckoned before it runs.
- ``instance.py``: a value against a schema, every error up to the cap and a count of the
  rest.
"""
