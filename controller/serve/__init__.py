"""`ffswarm serve`, the daemon above the use case (controller/run/usecase.py): the inbox loop
(daemon.py), one job file or one pack run through the use case (jobs.py), the hostile inbox and its
claim leases (inbox.py), the swarm's GPUs shared between the jobs it runs at once by tenant weight
(shares.py), small jobs packed into shared chunk services (packing.py, packs.py), whose chunks may run
in lingering chunk services (lanes: controller/run/lanes.py). It builds its DockerSwarm here;
controller/run/ never imports it."""
