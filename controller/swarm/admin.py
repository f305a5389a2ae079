"""Node and swarm-level calls that jobs never make (``ffswarm nodes``, ``ffswarm doctor``), kept
apart from the SwarmBackend surface; with controller/swarm/docker.py the only importers of docker."""

from __future__ import annotations

from collections.abc import Mapping

import docker.errors
import requests.exceptions

from controller.errors import EngineUnavailable
from controller.swarm import network
from controller.swarm.backend import EndedContainer, ImageInfo, NodeInfo, SwarmInfo
from controller.swarm.docker import DockerSwarm, engine_time, first_line, node_info, translated
from controller.swarm.servicespec import LABEL_JOB


class SwarmAdmin(DockerSwarm):
    """Node and swarm-level calls that jobs never make; kept apart from the SwarmBackend surface."""

    def swarm_info(self) -> SwarmInfo:
        with translated("reading the swarm state"):
            swarm = self._client.info().get("Swarm", {})
            manager = bool(swarm.get("ControlAvailable"))
            heartbeat = None
            if manager:
                period = self._client.api.inspect_swarm().get("Spec", {}).get("Dispatcher", {}).get("HeartbeatPeriod")
                heartbeat = period / 1e9 if period else None
        return SwarmInfo(swarm.get("LocalNodeState") == "active", manager, str(swarm.get("NodeID", "")), heartbeat)

    def node_infos(self) -> list[NodeInfo]:
        with translated("listing nodes"):
            return [node_info(n) for n in self._client.api.nodes()]

    def update_node_labels(self, node: str, add: Mapping[str, str], remove: tuple[str, ...] = ()) -> NodeInfo:
        """Add/replace and remove node labels in one update (at the node's current version)."""
        with translated(f"labelling node {node}"):
            raw = self._client.api.inspect_node(node)
            spec = dict(raw["Spec"])
            labels = {k: v for k, v in (spec.get("Labels") or {}).items() if k not in remove}
            labels.update(add)
            spec["Labels"] = labels
            self._client.api.update_node(raw["ID"], raw["Version"]["Index"], spec)
            return node_info(self._client.api.inspect_node(raw["ID"]))

    def missing_anchors(self, network_name: str) -> list[str] | None:
        """Nodes whose runners' network anchor is not running; None: no such internal network."""
        with translated(f"inspecting network {network_name}"):
            return network.missing_anchors(self._client, network_name)

    def image_info(self, ref: str) -> ImageInfo | None:
        """The local image ref names on this engine (ID, size, labels), None when it is absent."""
        try:
            attrs = self._client.images.get(ref).attrs
        except docker.errors.ImageNotFound:
            return None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise EngineUnavailable(f"image {ref}: cannot reach the Docker engine: {first_line(e)}") from e
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        return ImageInfo(str(attrs["Id"]), int(attrs.get("Size") or 0), {str(k): str(v) for k, v in labels.items()})

    def ended_job_containers(self) -> list[EndedContainer]:
        """This engine's containers of ffswarm jobs (runners, steps, lanes) that have exited or died."""
        with translated("listing this engine's ended job containers"):
            found = self._client.api.containers(all=True, filters={"label": LABEL_JOB, "status": ["exited", "dead"]})
            ended = []
            for c in found:
                try:
                    state = self._client.api.inspect_container(c["Id"]).get("State") or {}
                except docker.errors.NotFound:
                    continue  # removed meanwhile (the swarm agent's own clean-up)
                names = c.get("Names") or [c["Id"][:12]]
                job = (c.get("Labels") or {}).get(LABEL_JOB, "")
                finished = engine_time(state.get("FinishedAt"))
                ended.append(EndedContainer(c["Id"][:12], names[0].lstrip("/"), job, finished))
        return ended

    def remove_container(self, container_id: str) -> bool:
        """Remove an ended container and its anonymous volumes; False when it was gone already."""
        with translated(f"removing container {container_id}"):
            try:
                self._client.api.remove_container(container_id, v=True)
            except docker.errors.NotFound:
                return False
        return True

    def sweep_ended_job_containers(
        self, older_than: float, now: float, dry_run: bool = False
    ) -> tuple[list[EndedContainer], list[EndedContainer]]:
        """Remove the job containers that ended more than ``older_than`` seconds before ``now``; the
        ones and those kept. The swarm agent removes a removed service's containers itself, but not
        after its engine restarted while the removal was under way (moby/moby#42723): those stay for
        good. A runner's results and logs are on the volume and its service's logs are read as it
        ends, so an ended container is safe to remove once its controller has had time to look."""
        removed, kept = [], []
        for c in self.ended_job_containers():
            if now - c.finished_at < older_than:
                kept.append(c)
            elif dry_run or self.remove_container(c.container_id):
                removed.append(c)
        return removed, kept
