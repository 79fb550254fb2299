"""Trainer-side SDK for raas (httpx + pydantic only: installs without the server)."""

from raas_client.batch import Batch, Collector, Group, advantages
from raas_client.branch_models import RolloutTree
from raas_client.models import FailureClass, RolloutView, TrainingSample, Trajectory, failure_class_of
from raas_client.sdk import RaasClient, RaasHTTPError

__all__ = [
    "Batch",
    "Collector",
    "FailureClass",
    "Group",
    "RaasClient",
    "RaasHTTPError",
    "RolloutTree",
    "RolloutView",
    "TrainingSample",
    "Trajectory",
    "advantages",
    "failure_class_of",
]
