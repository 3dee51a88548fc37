"""The autoscaling manifests in contrib/autoscaling load, name the metrics jobq exports, and (ECS)
are valid input for the AWS API calls they are written for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CONTRIB = REPO / "contrib" / "autoscaling"

# Exported by every worker (recommended workers) and, from `Transport.queue_depth`, by the daemons
# that export the broker's backlog.
METRICS = ("jobq_queue_backlog", "jobq_queue_oldest_age_seconds", "jobq_worker_recommended_workers")


def test_the_keda_scaled_object_scales_the_worker_deployment_on_jobq_metrics() -> None:
    doc: dict[str, Any] = yaml.safe_load((CONTRIB / "keda-scaledobject.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    spec = doc["spec"]
    assert spec["scaleTargetRef"]["kind"] == "Deployment" and spec["scaleTargetRef"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    queries = []
    for trigger in spec["triggers"]:
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert meta["serverAddress"].startswith("http")
        # KEDA reads trigger metadata as strings: a bare number is refused by its admission webhook.
        assert all(isinstance(value, str) for value in meta.values()), meta
        assert float(meta["threshold"]) > 0
        queries.append(meta["query"])
    assert all(any(metric in query for query in queries) for metric in METRICS)


def test_the_ecs_policy_is_valid_input_for_application_auto_scaling() -> None:
    botocore_session = pytest.importorskip("botocore.session")
    from botocore.validate import validate_parameters

    doc = json.loads((CONTRIB / "ecs-target-tracking.json").read_text())
    model = botocore_session.get_session().get_service_model("application-autoscaling")
    for operation in ("RegisterScalableTarget", "PutScalingPolicy"):
        validate_parameters(doc[operation], model.operation_model(operation).input_shape)  # raises when invalid
    tracking = doc["PutScalingPolicy"]["TargetTrackingScalingPolicyConfiguration"]
    metrics = tracking["CustomizedMetricSpecification"]["Metrics"]
    assert [m["Id"] for m in metrics if m["ReturnData"]] == ["backlog_per_task"]
    assert any(m.get("MetricStat", {}).get("Metric", {}).get("MetricName") == "jobq_queue_backlog" for m in metrics)
    assert doc["RegisterScalableTarget"]["ResourceId"] == doc["PutScalingPolicy"]["ResourceId"]
