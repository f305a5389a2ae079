"""The soak's plan: which fault at which second, which request at which second, all from one seed.

Pure and reproducible: ``make_plan(seed, …)`` gives the same plan for the same arguments, so a
failed soak is replayed with ``--seed``. Targets (which runner, which worker) are chosen at run time
from what exists then, by the fault's own seeded ``pick`` number, so the choice replays too as long
as the cluster looks the same.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass

FAULT_KINDS = (
    "kill_runner",  # kill -9 a runner (chunk or lane) container on a worker
    "kill_serve",  # SIGKILL the serve container; the stack restarts it
    "kill_api_mid_upload",  # SIGKILL an API replica while a ZIP upload streams into it
    "restart_engine",  # restart a worker's dockerd (the node container)
    "drain_worker",  # drain a worker, then set it active again
    "stop_store",  # stop the object store 30 s (only with an S3 endpoint)
    "pause_worker",  # pause a worker's node container 40 s: a network cut as its manager sees it
    "fill_volume",  # fill the data volume 20 s
)
DURATIONS = {"stop_store": 30.0, "pause_worker": 40.0, "fill_volume": 20.0, "drain_worker": 20.0}
REQUEST_KINDS = ("photo", "zip", "pairs", "video", "s3", "cancel", "retry")
WEIGHTS = {"photo": 60, "zip": 14, "pairs": 8, "video": 3, "s3": 5, "cancel": 5, "retry": 5}
TENANTS = ("soak-a", "soak-b", "soak-c")
VARIANTS = 4  # distinct requests of each kind: the reference run makes each one's outputs
FAULT_GAP = (15.0, 45.0)
SHORT_MINUTES = 5.0
MEAN_GAP = 1.4  # seconds between requests on average (all tenants): ~2,500 an hour


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the start of the faulted run
    kind: str
    pick: int  # chooses the target among those found at run time (index modulo their number)
    duration: float  # seconds the fault lasts (0: instantaneous)


@dataclass(frozen=True)
class Request:
    at: float
    tenant: str
    kind: str
    variant: int  # which of the kind's distinct requests (cancel/retry: how far back to reach)

    @property
    def key(self) -> str:
        """The request's identity for the reference comparison: same key, same outputs."""
        return f"{self.kind}-{self.variant}"


@dataclass(frozen=True)
class Plan:
    seed: int
    minutes: float
    short: bool
    s3: bool
    faults: tuple[Fault, ...]
    requests: tuple[Request, ...]

    def fault_counts(self) -> dict[str, int]:
        return {k: sum(f.kind == k for f in self.faults) for k in self.kinds()}

    def request_counts(self) -> dict[str, int]:
        return {k: sum(r.kind == k for r in self.requests) for k in REQUEST_KINDS if k != "s3" or self.s3}

    def kinds(self) -> tuple[str, ...]:
        return fault_kinds(self.s3)

    def distinct(self) -> list[Request]:
        """One request of each key that makes a job (not cancels or retries), earliest first: what the
        reference run submits alone."""
        seen: dict[str, Request] = {}
        for r in self.requests:
            if r.kind not in ("cancel", "retry"):
                seen.setdefault(r.key, r)
        return list(seen.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def fault_kinds(s3: bool) -> tuple[str, ...]:
    return tuple(k for k in FAULT_KINDS if s3 or k != "stop_store")


def make_plan(seed: int, minutes: float, short: bool = False, s3: bool = False, gap: float = MEAN_GAP) -> Plan:
    """The faults and requests of a soak of ``minutes`` (``short``: one fault of each kind, in a seeded
    order, in about five minutes; otherwise rounds of every kind once, so each comes about equally
    often). Faults are 15–45 s apart, the first one after the first gap; none starts in the last
    minute, so the last one ends before the stream stops. Requests come ``gap`` seconds apart on
    average (exponentially distributed: a steady stream with its bursts)."""
    if minutes <= 0:
        raise ValueError(f"--minutes must be more than 0, not {minutes}")
    if gap <= 0:
        raise ValueError(f"--gap must be more than 0, not {gap}")
    rng = random.Random(seed)
    kinds = fault_kinds(s3)
    total = minutes * 60.0
    faults: list[Fault] = []
    if short:
        order = list(kinds)
        rng.shuffle(order)
        at = 0.0
        for kind in order:
            at += rng.uniform(*FAULT_GAP)
            faults.append(Fault(round(at, 3), kind, rng.randrange(1 << 16), DURATIONS.get(kind, 0.0)))
        total = max(total, at + 60.0)
    else:
        at = rng.uniform(*FAULT_GAP)
        bag: list[str] = []
        while at < total - 60.0:
            if not bag:  # every kind once per round, in a seeded order: no kind starves
                bag = list(kinds)
                rng.shuffle(bag)
            kind = bag.pop()
            faults.append(Fault(round(at, 3), kind, rng.randrange(1 << 16), DURATIONS.get(kind, 0.0)))
            at += rng.uniform(*FAULT_GAP)
    requests: list[Request] = []
    names = [k for k in REQUEST_KINDS if s3 or k != "s3"]
    weights = [WEIGHTS[k] for k in names]
    at = rng.expovariate(1.0 / gap)
    while at < total:
        kind = rng.choices(names, weights)[0]
        variant = rng.randrange(1, 6) if kind in ("cancel", "retry") else rng.randrange(VARIANTS)
        requests.append(Request(round(at, 3), rng.choice(TENANTS), kind, variant))
        at += rng.expovariate(1.0 / gap)
    return Plan(seed, total / 60.0, short, s3, tuple(faults), tuple(requests))


def describe(plan: Plan, head: int = 20) -> str:
    """The plan for people (``--dry-run``): seed, faults by time, requests by kind and the first few."""
    mode = " (short)" if plan.short else ""
    lines = [f"seed {plan.seed}: {plan.minutes:g} min{mode}, S3 {'on' if plan.s3 else 'off'}"]
    lines.append(f"faults: {len(plan.faults)} " + json.dumps(plan.fault_counts()))
    lines += [f"  {f.at:8.1f}s  {f.kind:<20} pick {f.pick:<6} {f.duration:g}s" for f in plan.faults]
    lines.append(f"requests: {len(plan.requests)} " + json.dumps(plan.request_counts()))
    lines += [f"  {r.at:8.1f}s  {r.tenant:<7} {r.kind:<7} {r.variant}" for r in plan.requests[:head]]
    if len(plan.requests) > head:
        lines.append(f"  … {len(plan.requests) - head} more")
    lines.append(f"reference: {len(plan.distinct())} distinct requests run alone first")
    return "\n".join(lines)
