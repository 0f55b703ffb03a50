"""Cluster state kept in PostgreSQL, the engine's only source of truth: one module per subdomain."""

from .checkpoints import Checkpoint, TaskCheckpoint
from .cleanup import JobCleanupRecord
from .cluster import ClusterState, MasterCandidate, MasterLease, Member, Slot
from .connections import Connection
from .dirty import (
    DirtyJobState,
    DirtyTrackingGap,
    MemberLossIncident,
    RecoveryAttempt,
    RecoveryEpisode,
)
from .drain import MemberDrain
from .events import EngineEvent
from .fields import OrderedJSONField
from .jobs import ControlStep, Job, Pipeline, SplitAssignment, TaskGroup
from .metrics import MetricTotal
from .observability import CheckpointRecord, JobException, TaskLogLine
from .throughput import ThroughputSample

__all__ = [
    "Checkpoint",
    "CheckpointRecord",
    "ClusterState",
    "Connection",
    "ControlStep",
    "DirtyJobState",
    "DirtyTrackingGap",
    "EngineEvent",
    "Job",
    "JobCleanupRecord",
    "JobException",
    "MasterCandidate",
    "MasterLease",
    "Member",
    "MemberDrain",
    "MemberLossIncident",
    "MetricTotal",
    "OrderedJSONField",
    "Pipeline",
    "RecoveryAttempt",
    "RecoveryEpisode",
    "Slot",
    "SplitAssignment",
    "TaskCheckpoint",
    "TaskGroup",
    "TaskLogLine",
    "ThroughputSample",
]
