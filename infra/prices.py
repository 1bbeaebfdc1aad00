"""List prices for the offline cost estimate: pay-as-you-go, USD, Linux, East US, read from the
Azure pricing pages in 2026-11. Other regions, reservations and discounts differ; the estimate
says so. Update the table and PRICES_AS_OF together."""

PRICES_AS_OF = "2026-11"
HOURS_PER_MONTH = 730

VM_PER_HOUR = {
    "Standard_ND96isr_H100_v5": 98.32,
    "Standard_ND96isr_H200_v5": 110.24,
    "Standard_ND96asr_v4": 27.20,
    "Standard_ND96amsr_A100_v4": 32.77,
    "Standard_D2ds_v5": 0.113,  # the CPU acceptance profile's nodes
    "Standard_D2s_v5": 0.096,  # the CPU acceptance profile's NFS server
    "Standard_D8s_v5": 0.384,
    "Standard_D16s_v5": 0.768,
    "Standard_D32s_v5": 1.536,
}
PREMIUM_SSD_PER_GB_MONTH = 0.135
PREMIUM_FILES_PER_GB_MONTH = 0.16
NAT_GATEWAY_PER_HOUR = 0.045
PUBLIC_IP_PER_HOUR = 0.005
# A registry is billed a fixed charge per day it exists: a stack that lives an hour still pays
# one day of it (articles/container-registry/container-registry-skus.md sends prices to the
# pricing page; the per-day charge itself was not found in the docs as of 2026-11-28).
ACR_PREMIUM_PER_MONTH = 50.0
ACR_PREMIUM_PER_DAY = round(ACR_PREMIUM_PER_MONTH / 30, 3)
# What a stack's AzureML workspace costs by itself (the workspace is free; its vault bills per
# operation, a few cents): its private endpoint's hours (data processed, USD 0.01/GB, is left
# out) and its two private DNS zones.
PRIVATE_ENDPOINT_PER_HOUR = 0.01
PRIVATE_DNS_ZONE_PER_MONTH = 0.50
# ACR Tasks bill each second of each CPU of the build agent (Azure Container Registry pricing,
# "Container Build": USD 0.0001 per CPU-second, read 2026-11), whatever the registry's tier.
ACR_TASK_PER_CPU_SECOND = 0.0001

# Where each price above was read, and when (tests/ci/test_fact_dates.py holds every price to an
# entry here). The pages were read in 2026-11 for the first estimate; on 2026-11-28 none of them
# (nor the retail prices API) could be re-read, so these figures stand unconfirmed since then.
_VM_PAGE = "Linux VM pricing page (azure.microsoft.com/pricing/details/virtual-machines/linux)"
SOURCES: dict[str, str] = {
    "Standard_ND96isr_H100_v5": f"{_VM_PAGE}, ND H100 v5 series, East US, read 2026-11",
    "Standard_ND96isr_H200_v5": f"{_VM_PAGE}, ND H200 v5 series, East US, read 2026-11",
    "Standard_ND96asr_v4": f"{_VM_PAGE}, ND A100 v4 series, East US, read 2026-11",
    "Standard_ND96amsr_A100_v4": f"{_VM_PAGE}, NDm A100 v4 series, East US, read 2026-11",
    "Standard_D2ds_v5": f"{_VM_PAGE}, Ddsv5 series, East US: the list price as last known, "
    "unconfirmed as of 2026-11-28 (neither the page nor the retail prices API could be read)",
    "Standard_D2s_v5": f"{_VM_PAGE}, Dsv5 series, East US, read 2026-11",
    "Standard_D8s_v5": f"{_VM_PAGE}, Dsv5 series, East US, read 2026-11",
    "Standard_D16s_v5": f"{_VM_PAGE}, Dsv5 series, East US, read 2026-11",
    "Standard_D32s_v5": f"{_VM_PAGE}, Dsv5 series, East US, read 2026-11",
    "PREMIUM_SSD_PER_GB_MONTH": "Managed Disks pricing page, Premium SSD, per GB, read 2026-11",
    "PREMIUM_FILES_PER_GB_MONTH": "Azure Files pricing page, Premium (provisioned), read 2026-11",
    "NAT_GATEWAY_PER_HOUR": "NAT Gateway pricing page, per gateway-hour, read 2026-11",
    "PUBLIC_IP_PER_HOUR": "IP Addresses pricing page, Standard static IPv4, read 2026-11",
    "ACR_PREMIUM_PER_MONTH": "Container Registry pricing page, Premium tier, read 2026-11",
    "ACR_PREMIUM_PER_DAY": "ACR_PREMIUM_PER_MONTH / 30 (the page bills per day), read 2026-11",
    "ACR_TASK_PER_CPU_SECOND": "Container Registry pricing page, Container Build, read 2026-11",
    "PRIVATE_ENDPOINT_PER_HOUR": "Azure Private Link pricing as third-party cost guides quote it "
    "(per endpoint-hour, East US), read 2026-11-29; the official page could not be read",
    "PRIVATE_DNS_ZONE_PER_MONTH": "Azure DNS pricing, private zones, first 25 per month: the "
    "price as last known, unconfirmed as of 2026-11-29 (the official page could not be read)",
}
