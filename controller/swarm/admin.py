"""Node and swarm-level calls that jobs never make (``ffswarm nodes``, ``ffswarm doctor``), kept
apart from the SwarmBackend surface; with controller/swarm/docker.py the only importers of docker."""

from __future__ import annotations

from collections.abc import Mapping

import docker.errors
import requests.exceptions

from controller.errors import EngineUnavailable
from controller.swarm import network
from controller.swarm.backend import ImageInfo, NodeInfo, SwarmInfo
from controller.swarm.docker import DockerSwarm, first_line, node_info, translated


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
