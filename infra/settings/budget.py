"""The budget's section: the monthly budget on the resource group, its first month and whom it
alerts, each field checked here (whether Azure takes the first month only the engine knows, when
the budget is created: ``infra.budget``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from infra.settings.checks import ConfigError, in_range
from infra.settings.schema import setting

_MONTH = re.compile(r"^20\d\d-(0[1-9]|1[0-2])$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """The monthly budget on the resource group; ``amount`` 0 declares none."""

    amount: int = setting(
        "budget",
        0,
        "Monthly budget in USD for the stack's resource group (0 = none; the policy pack "
        "requires one).",
    )
    start_month: str = setting(
        "budgetStartMonth",
        "",
        "First month (YYYY-MM) of a new budget, from the current month to twelve months ahead, "
        "checked when the budget is created (a preview stops); empty starts it in the month it "
        "is created. Later changes are ignored, so a month that has since passed keeps the "
        "stack deployable.",
    )
    emails: tuple[str, ...] = setting(
        "budgetEmails", (), "Addresses alerted at 80% of the budget spent and 100% forecast."
    )

    def check(self) -> None:
        in_range("budget", self.amount, 0, 10_000_000)
        if not self.amount:
            return
        if self.start_month and not _MONTH.match(self.start_month):
            raise ConfigError(
                f"budgetStartMonth={self.start_month!r}: give the first "
                "month as YYYY-MM, or leave it empty to start in the month it is created"
            )
        # Whether the month is one Azure takes depends on the month the budget is created in,
        # which only the engine knows: checked then (infra/budget.py), never on later updates.
        if not self.emails or not all(_EMAIL.match(e) for e in self.emails):
            raise ConfigError(
                f"budgetEmails={list(self.emails)}: a budget needs at least "
                "one valid e-mail address to alert"
            )


def current_month() -> str:
    """This month (UTC) as YYYY-MM: a new budget's first period."""
    return datetime.now(UTC).strftime("%Y-%m")
