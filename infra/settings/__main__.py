"""python -m infra.settings [--write]: Pulumi.yaml's ``config:`` block from the declarations."""

from infra.settings.pulumi_yaml import main

raise SystemExit(main())
