"""The elastic hybrid pool: workers move between rollout and training without touching the core.

Pure parts import without torch and are re-exported here: pools and roles (from :mod:`libra.spec.placement`), the
join state machine (:mod:`.states`), controller decisions (:mod:`.decisions`), the controller (:mod:`.controller`)
and executors (:mod:`.executor`). The runtime needs torch and is imported from its modules:

- :mod:`libra.elastic.core` — :class:`~libra.elastic.core.CoreExchange`, a core replica's side channel;
- :mod:`libra.elastic.hybrid` — :class:`~libra.elastic.hybrid.HybridReplica`, a hybrid replica's side channel;
- :mod:`libra.elastic.wire` — messages and :class:`~libra.elastic.wire.TcpLink`; :mod:`libra.elastic.dist_link` —
  :class:`~libra.elastic.dist_link.DistLink` (torch.distributed point-to-point);
- :mod:`libra.elastic.snapshot` — versioned model + optimizer snapshots; :mod:`libra.elastic.pack` — buckets;
- :mod:`libra.elastic.native` — the C++ extension in ``ext/`` and its ``is_compatible()`` check.

See docs/elastic.md for the protocol and how a trainer adapter plugs in.
"""

from libra.elastic.controller import CoreTopologyChange, ElasticController, UnknownWorker
from libra.elastic.decisions import CancelJoin, Decision, JoinTraining, LeaveTraining, StartInstance, StopInstance
from libra.elastic.executor import DispatchExecutor, Executor, UnhandledDecision
from libra.elastic.states import IllegalTransition, JoinEvent, JoinState, Transition, WorkerStates
from libra.spec.placement import Placement, Pool, Role, WorkerPlacement

__all__ = [
    "CancelJoin",
    "CoreTopologyChange",
    "Decision",
    "DispatchExecutor",
    "ElasticController",
    "Executor",
    "IllegalTransition",
    "JoinEvent",
    "JoinState",
    "JoinTraining",
    "LeaveTraining",
    "Placement",
    "Pool",
    "Role",
    "StartInstance",
    "StopInstance",
    "Transition",
    "UnhandledDecision",
    "UnknownWorker",
    "WorkerPlacement",
    "WorkerStates",
]
