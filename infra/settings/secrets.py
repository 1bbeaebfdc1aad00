"""The secret settings: declared like any other, read only as secret Outputs (``secret_setting``),
never into StackSettings as plain text; ``StackSettings.from_mapping`` checks they are stored
encrypted (``infra.settings.values.check_encrypted``)."""

from __future__ import annotations

from dataclasses import dataclass

from infra.naming import PROJECT
from infra.settings.schema import declared, setting


@dataclass(frozen=True, kw_only=True)
class SecretSettings:
    """Settings read only as secret Outputs (``secret_setting``), never into StackSettings as
    plain text; ``from_mapping`` checks they are stored encrypted."""

    image_source_token: str = setting(
        "imageSourceToken",
        "",
        "Token that can read a private imageSourceRepo (e.g. a fine-grained read-only PAT), "
        "given to the ACR build task; set it with `pulumi config set --secret imageSourceToken "
        "...` (a plain-text value is refused). Empty for a public repository.",
        note='Not `secret: true`: the CLI then rejects the plain "" default on every stack that '
        "does not\nset a token (pulumi/pulumi#21865); infra/settings/values.py refuses a token "
        "stored unencrypted.",
    )


SECRET_SETTINGS = tuple(d.key for _, d in declared(SecretSettings))


def secret_setting(key: str):
    """A ``SECRET_SETTINGS`` value as a secret ``Output[str]`` (``Config.get_secret``), or None
    when unset: it never exists as plain text in the program, the state or the plan."""
    import pulumi

    if key not in SECRET_SETTINGS:
        raise ValueError(f"{key} is not a secret setting")
    return pulumi.Config(PROJECT).get_secret(key)
