"""The soak (scripts/soak.py): the three-node cluster under a steady stream of tenants' requests while
random faults are injected, then the end checks — nothing lost, nothing duplicated, nothing left behind.

- ``plan``: the seeded schedule of faults and requests (pure: the same seed gives the same plan);
- ``checks``: the end checks over the data root and what the API and the webhook receiver recorded;
- ``deploy``: the cluster, the soak's config and secrets, the controller stack as a user deploys it;
- ``faults``: each fault kind, done to the cluster's nodes through their engines;
- ``stream``: the tenants' requests over HTTP to the API replicas, and the webhook receiver;
- ``run``: the whole soak — reference run, faulted run, drain, checks, summary.
"""
