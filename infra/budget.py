"""A monthly consumption budget on the stack's resource group, alerting by e-mail at 80% spent
and at 100% forecast: the stack's own guardrail on top of the policy pack's estimate check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_azure_native import consumption

from infra.config import BudgetSettings, current_month

BUDGET_START_PROPERTY = "timePeriod.startDate"


@dataclass(frozen=True)
class BudgetArgs:
    resource_group_id: pulumi.Input[str]
    amount: int
    start_month: str  # YYYY-MM; "" starts the budget in the month it is created
    emails: Sequence[str]

    @classmethod
    def from_settings(
        cls, resource_group_id: pulumi.Input[str], budget: BudgetSettings
    ) -> BudgetArgs:
        return cls(resource_group_id, budget.amount, budget.start_month, budget.emails)


class CostBudget(pulumi.ComponentResource):
    def __init__(
        self, name: str, args: BudgetArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("gpucluster:infra:CostBudget", name, None, opts)
        self.budget = consumption.Budget(
            f"{name}-budget",
            budget_name=f"{name}-monthly",
            scope=args.resource_group_id,
            amount=args.amount,
            category=consumption.CategoryType.COST,
            time_grain=consumption.TimeGrainType.MONTHLY,
            time_period=consumption.BudgetTimePeriodArgs(
                start_date=f"{args.start_month or current_month()}-01"
            ),
            notifications={
                "actual-80": _alert(80, consumption.ThresholdType.ACTUAL, args.emails),
                "forecast-100": _alert(100, consumption.ThresholdType.FORECASTED, args.emails),
            },
            # The start is fixed when the budget is created: Azure refuses one before the current
            # period, so a later `pulumi up` (a later month) must not try to move it.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=[BUDGET_START_PROPERTY]),
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
