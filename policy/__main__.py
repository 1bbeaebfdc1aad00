"""Entry point the Pulumi CLI runs for `pulumi preview --policy-pack policy`.

PolicyPack() starts the analyzer server and blocks, so it is only ever constructed here; the
rules themselves are importable from policy.rules and tested directly.
"""

import os
import sys

# The CLI runs this file from policy/; the rules import the project's own modules.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulumi_policy import EnforcementLevel, PolicyPack

from policy.rules import ALL_POLICIES

PolicyPack(
    name="gpu-cluster-guardrails",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=ALL_POLICIES,
)
