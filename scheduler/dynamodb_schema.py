"""The DynamoDB store's table: keys, secondary indexes and TTL, as a CreateTable request and as
infrastructure code (a CloudFormation template, a Terraform resource) for `jobq init --print`.

The design behind the keys and indexes is drawn in docs/dynamodb.md; `DynamoTable.create`
(`jobq.dynamodb`) sends `table_definition` and enables TTL on `TTL_ATTRIBUTE`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from jobq.errors import ConfigError

TTL_ATTRIBUTE = "ttl"  # epoch seconds; set on idempotency items, which DynamoDB then deletes

#: The secondary indexes (see docs/dynamodb.md). Sparse: an item is indexed only while it carries
#: both key attributes of the index.
GSIS: tuple[dict[str, Any], ...] = (
    {
        # The reaper (leased runs by lease expiry), beat's repair (SCHEDULED runs by due time, one
        # partition per tier) and the dead-letter list (by nominal time).
        "IndexName": "GSI1",
        "KeySchema": [{"AttributeName": "GSI1PK", "KeyType": "HASH"}, {"AttributeName": "GSI1SK", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"},
    },
    {
        # Beat: ACTIVE jobs by next fire time.
        "IndexName": "GSI2",
        "KeySchema": [{"AttributeName": "GSI2PK", "KeyType": "HASH"}, {"AttributeName": "GSI2SK", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "ALL"},
    },
    {
        # Job listings: a tenant's jobs by id. Only the filtered attributes are projected, so the
        # index is written when a job is created or its status changes, not on every fire.
        "IndexName": "GSI3",
        "KeySchema": [{"AttributeName": "GSI3PK", "KeyType": "HASH"}, {"AttributeName": "GSI3SK", "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["tenant_id", "status", "priority", "name"]},
    },
)
_ATTRIBUTES = (
    ("PK", "S"),
    ("SK", "S"),
    ("GSI1PK", "S"),
    ("GSI1SK", "N"),
    ("GSI2PK", "S"),
    ("GSI2SK", "N"),
    ("GSI3PK", "S"),
    ("GSI3SK", "S"),
)


def table_definition(table: str) -> dict[str, Any]:
    """The CreateTable request for `table`: keys PK/SK, GSI1-3, on-demand capacity."""
    return {
        "TableName": table,
        "AttributeDefinitions": [{"AttributeName": n, "AttributeType": t} for n, t in _ATTRIBUTES],
        "KeySchema": [{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
        "GlobalSecondaryIndexes": [dict(g) for g in GSIS],
        "BillingMode": "PAY_PER_REQUEST",
    }


def render_definition(table: str, fmt: Literal["cloudformation", "terraform"]) -> str:
    """The table as a CloudFormation template (JSON) or a Terraform ``aws_dynamodb_table`` resource,
    equivalent to what `DynamoTable.create` makes (TTL included), for `jobq init --print`."""
    definition = table_definition(table)
    if fmt == "cloudformation":
        properties = {
            **definition,
            "TimeToLiveSpecification": {"AttributeName": TTL_ATTRIBUTE, "Enabled": True},
        }
        template = {
            "AWSTemplateFormatVersion": "2010-09-09",
            "Description": "jobq store: one DynamoDB table (single-table design)",
            "Resources": {"JobqTable": {"Type": "AWS::DynamoDB::Table", "Properties": properties}},
            "Outputs": {"TableName": {"Value": {"Ref": "JobqTable"}}},
        }
        return json.dumps(template, indent=2) + "\n"
    if fmt == "terraform":
        return _terraform(definition)
    raise ConfigError("format", fmt, "use cloudformation or terraform")


def _terraform(definition: Mapping[str, Any]) -> str:
    q = json.dumps  # HCL string and list literals are JSON literals

    def block(header: str, pairs: Sequence[tuple[str, str]], indent: str = "  ") -> list[str]:
        width = max(len(k) for k, _ in pairs)  # `terraform fmt` aligns the = of adjacent lines
        return [f"{indent}{header} {{", *(f"{indent}  {k:<{width}} = {v}" for k, v in pairs), f"{indent}}}"]

    top = [
        ("name", q(definition["TableName"])),
        ("billing_mode", q(definition["BillingMode"])),
        ("hash_key", q("PK")),
        ("range_key", q("SK")),
    ]
    lines = block('resource "aws_dynamodb_table" "jobq"', top, indent="")[:-1]  # closed after the nested blocks
    for attribute in definition["AttributeDefinitions"]:
        pairs = [("name", q(attribute["AttributeName"])), ("type", q(attribute["AttributeType"]))]
        lines += ["", *block("attribute", pairs)]
    for gsi in definition["GlobalSecondaryIndexes"]:
        hash_key, range_key = (k["AttributeName"] for k in gsi["KeySchema"])
        projection = gsi["Projection"]
        pairs = [
            ("name", q(gsi["IndexName"])),
            ("hash_key", q(hash_key)),
            ("range_key", q(range_key)),
            ("projection_type", q(projection["ProjectionType"])),
        ]
        if "NonKeyAttributes" in projection:
            pairs.append(("non_key_attributes", q(projection["NonKeyAttributes"])))
        lines += ["", *block("global_secondary_index", pairs)]
    lines += ["", *block("ttl", [("attribute_name", q(TTL_ATTRIBUTE)), ("enabled", "true")]), "}"]
    return "\n".join(lines) + "\n"
