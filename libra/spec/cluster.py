"""A cluster: `num_nodes` nodes of `gpus_per_node` identical GPUs, NVLink inside a node, a network between nodes."""

from __future__ import annotations

import numbers

import attrs
import networkx as nx

from libra.spec import checks
from libra.spec.errors import SpecError
from libra.spec.hardware import GPUSpec

MAX_GPUS = 65_536  # the planner tabulates every GPU count up to the cluster size
MAX_GPUS_PER_NODE = 64


@attrs.frozen(kw_only=True)
class ClusterSpec:
    """GPU ids are global: GPU `g` lives on node `g // gpus_per_node`."""

    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.gpu, GPUSpec):
            raise SpecError(f"ClusterSpec.gpu must be a GPUSpec, got {self.gpu!r}")
        checks.whole("ClusterSpec", "num_nodes", self.num_nodes, 1, MAX_GPUS)
        checks.whole("ClusterSpec", "gpus_per_node", self.gpus_per_node, 1, MAX_GPUS_PER_NODE)
        if self.num_gpus > MAX_GPUS:
            raise SpecError(f"a cluster of {self.num_gpus:,} GPUs is more than the {MAX_GPUS:,} Libra plans for")

    @classmethod
    def from_total(cls, *, gpu: GPUSpec, num_gpus: int, gpus_per_node: int) -> ClusterSpec:
        for name, value in (("num_gpus", num_gpus), ("gpus_per_node", gpus_per_node)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # "8": TypeError; True: 1 GPU
                raise SpecError(f"ClusterSpec.from_total: {name} must be an integer, got {value!r}")
        num_gpus, gpus_per_node = int(num_gpus), int(gpus_per_node)  # numpy's integers too
        if not 1 <= num_gpus <= MAX_GPUS:
            raise SpecError(f"the number of GPUs must be between 1 and {MAX_GPUS:,}, got {num_gpus}")
        if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
            raise SpecError(f"GPUs per node must be between 1 and {MAX_GPUS_PER_NODE}, got {gpus_per_node}")
        if num_gpus % gpus_per_node:
            raise SpecError(
                f"GPUs per node ({gpus_per_node}) must divide the number of GPUs ({num_gpus}); "
                f"try --gpus {max(gpus_per_node, num_gpus - num_gpus % gpus_per_node)}"
            )
        return cls(gpu=gpu, num_nodes=num_gpus // gpus_per_node, gpus_per_node=gpus_per_node)

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def node_of(self, gpu_id: int) -> int:
        if not 0 <= gpu_id < self.num_gpus:
            raise SpecError(f"GPU id {gpu_id} outside the cluster (0..{self.num_gpus - 1})")
        return gpu_id // self.gpus_per_node

    def gpus_of_node(self, node: int) -> range:
        return range(node * self.gpus_per_node, (node + 1) * self.gpus_per_node)

    def graph(self) -> nx.Graph:
        """Topology graph: one vertex per GPU (`gpu`, node attributes) and per node switch; NVLink edges join
        every pair of GPUs in a node, network edges join each GPU to its node's switch and switches to a core."""
        g = nx.Graph()
        g.add_node("core", kind="network")
        for node in range(self.num_nodes):
            switch = f"node{node}"
            g.add_node(switch, kind="switch", node=node)
            uplink = self.gpu.network_bandwidth_gbs * self.gpus_per_node
            g.add_edge(switch, "core", kind="network", bandwidth_gbs=uplink)
            gpus = list(self.gpus_of_node(node))
            for gid in gpus:
                g.add_node(gid, kind="gpu", node=node)
                g.add_edge(gid, switch, kind="network", bandwidth_gbs=self.gpu.network_bandwidth_gbs)
            for i, a in enumerate(gpus):
                for b in gpus[i + 1 :]:
                    g.add_edge(a, b, kind="nvlink", bandwidth_gbs=self.gpu.nvlink_bandwidth_gbs)
        return g

    def nvlink_domains(self) -> list[list[int]]:
        """The sets of GPUs joined by NVLink (one per node)."""
        g = self.graph()
        nv = nx.Graph([(a, b) for a, b, d in g.edges(data=True) if d["kind"] == "nvlink"])
        nv.add_nodes_from(n for n, d in g.nodes(data=True) if d["kind"] == "gpu")
        return sorted(sorted(c) for c in nx.connected_components(nv))
