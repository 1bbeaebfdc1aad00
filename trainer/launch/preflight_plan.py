"""What the launcher's preflight measures and how it judges, as pure data: the rounds of groups
timed (each node's own workers together, then pairs of nodes along a ring, at most three
rounds whatever the node count), the floors (the VM size's, or relative to the other nodes'
figures where the size has none), and the verdict that names a slow node or link by its Batch
node id with the ``dt-jobs keep-out`` line that keeps it out. ``trainer.launch.preflight`` runs
it; ``trainer.launch.preflight_probe`` measures. Why: docs/internals.md,
`trainer/launch/preflight.py`."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trainer.launch.node_sizes import fabric_for, node_floor, preflight_floor

# Without a floor of the VM size (CPU nodes, Gloo): a figure below this fraction of the median
# of the other nodes' (or pairs') figures is slow.
RELATIVE_FRACTION = 0.5
# The command that keeps a node out of the job's next tries (dt_commands/jobs/keep_out.py; its
# usage line in docs/jobs.md); the node knows neither the stack nor the job's name.
KEEP_OUT = "dt-jobs keep-out --stack NAME {node_id}"


@dataclass(frozen=True)
class Group:
    """One timed collective: ``nodes`` (positions, the master first, as ranks are counted) and
    their workers' ranks."""

    nodes: tuple[int, ...]
    ranks: tuple[int, ...]


def _ranks(node: int, slots: int) -> tuple[int, ...]:
    return tuple(range(node * slots, (node + 1) * slots))


def ring_pairs(nodes: int) -> list[tuple[int, int]]:
    """Each node with the next one, the last with the first: every node is in two pairs (from
    three nodes on), so a slow node slows both of its pairs and a slow link only its own."""
    if nodes < 3:
        return [(0, 1)] if nodes == 2 else []
    return [(i, (i + 1) % nodes) for i in range(nodes)]


def rounds(nodes: int, slots: int) -> list[list[Group]]:
    """The groups timed together in each round: every node's own workers (when it has two or
    more), then the ring's pairs, each round taking the pairs whose nodes are free in it (an even
    ring needs two rounds, an odd one three)."""
    planned: list[list[Group]] = []
    if slots > 1:
        planned.append([Group((node,), _ranks(node, slots)) for node in range(nodes)])
    pending = ring_pairs(nodes)
    while pending:
        busy: set[int] = set()
        this, later = [], []
        for a, b in pending:
            if a in busy or b in busy:
                later.append((a, b))
                continue
            busy |= {a, b}
            this.append(Group((a, b), _ranks(a, slots) + _ranks(b, slots)))
        planned.append(this)
        pending = later
    return planned


def bus_gbps(megabytes: float, ranks: int, seconds: float) -> float:
    """Allreduce bus bandwidth as nccl-tests counts it: bytes / time x 2(n-1)/n, the traffic
    each link of a ring carries, so figures compare across group sizes."""
    return megabytes * 2**20 * 2 * (ranks - 1) / ranks / seconds / 1e9


@dataclass(frozen=True)
class Floors:
    """GB/s a node's own workers and a pair of nodes must reach; 0.0: relative to the others."""

    node_gbps: float = 0.0
    pair_gbps: float = 0.0

    @classmethod
    def of(cls, vm_size: str | None) -> Floors:
        if vm_size is None or fabric_for(vm_size).gpus == 0:
            return cls()
        return cls(node_floor(vm_size), preflight_floor(vm_size))


@dataclass(frozen=True)
class Name:
    """A node as the verdict names it: its address and Batch node id (AZ_BATCH_NODE_ID)."""

    host: str
    node_id: str = ""

    def __str__(self) -> str:
        return f"{self.host} ({self.node_id})" if self.node_id else self.host

    def keep_out(self) -> str:
        if not self.node_id:
            return "no AZ_BATCH_NODE_ID (not a Batch node): nothing to keep out"
        return KEEP_OUT.format(node_id=self.node_id)


@dataclass(frozen=True)
class Measured:
    group: Group
    gbps: float


@dataclass(frozen=True)
class Verdict:
    lines: list[str]  # every figure, then each slow node or link with its keep-out line
    failure: str | None  # the one-line reason the try fails; None when it passed


def _floor(m: Measured, same_kind: list[Measured], absolute: float) -> tuple[float, str] | None:
    """(the floor, how the line says it) for ``m``, None when nothing can judge it (one pair)."""
    if absolute > 0:
        return absolute, f"{absolute:g} GB/s (the VM size's)"
    others = [o.gbps for o in same_kind if o is not m]
    if not others:
        return None
    kind = "nodes" if len(m.group.nodes) == 1 else "pairs"
    floor = RELATIVE_FRACTION * statistics.median(others)
    return floor, f"{floor:.3g} GB/s (half the other {kind}' median: no size floor)"


def judge(measured: list[Measured], names: list[Name], floors: Floors) -> Verdict:
    """The figures, judged: a node whose own workers are slow, or both of whose pairs are, is
    named; a slow pair neither of whose nodes is named is a slow link, named by both nodes."""
    within = [m for m in measured if len(m.group.nodes) == 1]
    pairs = [m for m in measured if len(m.group.nodes) == 2]
    lines, slow = [], []
    for m, kind, absolute in [(m, within, floors.node_gbps) for m in within] + [
        (m, pairs, floors.pair_gbps) for m in pairs
    ]:
        floor = _floor(m, kind, absolute)
        who = " and ".join(str(names[n]) for n in m.group.nodes)
        below = floor is not None and m.gbps < floor[0]
        judged = "not judged: nothing to compare it with" if floor is None else floor[1]
        if floor is not None:
            judged = f"{'BELOW' if below else 'at or above'} the floor {judged}"
        where = "node" if len(m.group.nodes) == 1 else "nodes"
        lines.append(
            f"preflight: {where} {who}: {len(m.group.ranks)} workers, allreduce "
            f"{m.gbps:.3g} GB/s; {judged}"
        )
        if below:
            slow.append(m)
    return _named(slow, pairs, names, lines)


def _named(slow: list[Measured], pairs: list[Measured], names: list[Name], lines: list[str]):
    nodes = {m.group.nodes[0] for m in slow if len(m.group.nodes) == 1}
    slow_pairs = [m for m in slow if len(m.group.nodes) == 2]
    for node in range(len(names)):
        mine = [m for m in pairs if node in m.group.nodes]
        if len(mine) >= 2 and sum(m in slow_pairs for m in mine) >= 2:
            nodes.add(node)
    reasons = []
    for node in sorted(nodes):
        lines.append(
            f"preflight: node {names[node]} is slow; keep it out of the job's next tries: "
            f"{names[node].keep_out()}"
        )
        reasons.append(f"slow node {names[node]}: {names[node].keep_out()}")
    for m in slow_pairs:
        a, b = (names[n] for n in m.group.nodes)
        if set(m.group.nodes) & nodes:
            continue
        lines.append(
            f"preflight: the link between {a} and {b} is slow (or one of their InfiniBand "
            f"ports); keep one of them out: {a.keep_out()} (or {b.keep_out()})"
        )
        reasons.append(f"slow link between {a} and {b}: {a.keep_out()} (or {b.keep_out()})")
    failure = "preflight: " + "; ".join(reasons) if reasons else None
    return Verdict(lines, failure)
