"""The stack's settings, one module per section, each declaring and checking its own fields.

``stack`` (``StackSettings``: the top-level settings, and ``from_mapping``, which reads a stack's
values through ``values`` and checks them all), one module per section (``network``, ``cluster``,
``nfs``, ``image``, ``secrets``, ``budget``, and ``jobs``: the jobs map), ``rules`` (the rules
that span two sections), ``schema`` (how a field declares its setting) and ``pulumi_yaml``
(Pulumi.yaml's ``config:`` block written from the declarations: ``python -m infra.settings``).
"""
