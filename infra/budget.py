"""A monthly consumption budget on the stack's resource group, alerting by e-mail at 80% spent
and at 100% forecast: the stack's own guardrail on top of the policy pack's estimate check."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pulumi
from pulumi_azure_native import consumption

from infra.settings import budget as budget_section
from infra.settings.budget import BudgetSettings
from infra.settings.checks import ConfigError

BUDGET_START_PROPERTY = "timePeriod.startDate"
# Azure's rule for a cost budget's start (Consumption REST, BudgetTimePeriod.startDate): "Future
# start date should not be more than twelve months. Past start date should be selected within
# the timegrain period" (the current month, for a monthly budget).
MONTHS_AHEAD = 12


def _month_index(month: str) -> int:
    year, number = month.split("-")
    return int(year) * 12 + int(number) - 1


def start_problem(start_date: str, this_month: str) -> str | None:
    """Why Azure would refuse to create a monthly budget starting on ``start_date`` (YYYY-MM-01)
    in ``this_month`` (YYYY-MM); None when it takes it (or the date is not one: the policy
    pack's budget-starts-on-the-first says so)."""
    if not re.fullmatch(r"\d{4}-\d{2}-01", start_date[:10]):
        return None
    ahead = _month_index(start_date[:7]) - _month_index(this_month)
    if ahead < 0:
        return f"before the current month {this_month}"
    if ahead > MONTHS_AHEAD:
        return f"more than {MONTHS_AHEAD} months after the current month {this_month}"
    return None


def refuse_a_start_azure_would(args: pulumi.ResourceHookArgs) -> None:
    """Before the engine creates the budget (a new stack, a budget newly turned on, or a
    replacement), never on an update: the start is fixed at creation and ignored afterwards
    (``ignore_changes``), so a budgetStartMonth that has since passed keeps the stack
    deployable. Runs in previews too, so `pulumi preview` and `pulumi up`'s own preview stop
    before anything is created."""
    start = str(((args.new_inputs or {}).get("timePeriod") or {}).get("startDate") or "")
    problem = start_problem(start, budget_section.current_month())
    if problem is not None:
        raise ConfigError(
            f"budgetStartMonth={start[:7]}: {problem}, which Azure refuses for a new budget "
            "(this deployment creates the stack's budget); set a month from the current one "
            "on, or leave it empty to start in the month it is created"
        )


class CostBudget(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        budget: BudgetSettings,
        resource_group_id: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("gpucluster:infra:CostBudget", name, None, opts)
        self.budget = consumption.Budget(
            f"{name}-budget",
            budget_name=f"{name}-monthly",
            scope=resource_group_id,
            amount=budget.amount,
            category=consumption.CategoryType.COST,
            time_grain=consumption.TimeGrainType.MONTHLY,
            time_period=consumption.BudgetTimePeriodArgs(
                start_date=f"{budget.start_month or budget_section.current_month()}-01"
            ),
            notifications={
                "actual-80": _alert(80, consumption.ThresholdType.ACTUAL, budget.emails),
                "forecast-100": _alert(100, consumption.ThresholdType.FORECASTED, budget.emails),
            },
            # The start is fixed when the budget is created: Azure refuses one before the current
            # period, so a later `pulumi up` (a later month) must not try to move it, and the
            # start is checked only when the engine creates the budget.
            opts=pulumi.ResourceOptions(
                parent=self,
                ignore_changes=[BUDGET_START_PROPERTY],
                hooks=pulumi.ResourceHookBinding(
                    before_create=[
                        pulumi.ResourceHook(
                            f"{name}-budget-start",
                            refuse_a_start_azure_would,
                            pulumi.ResourceHookOptions(on_dry_run=True),
                        )
                    ]
                ),
            ),
        )
        self.register_outputs({"budget_id": self.budget.id})


def _alert(
    percent: int, kind: consumption.ThresholdType, emails: Sequence[str]
) -> consumption.NotificationArgs:
    return consumption.NotificationArgs(
        enabled=True,
        threshold=percent,
        threshold_type=kind,
        operator=consumption.OperatorType.GREATER_THAN_OR_EQUAL_TO,
        contact_emails=list(emails),
    )
