"""The AWS deployment: DynamoDB (store), Redis (time index, as ElastiCache would be), SQS (queues)
and S3 (history), run locally against moto's server and this machine's Redis. One command:

    python -m examples.aws

It starts moto's server on a free port (`pip install 'moto[server]'`, or moto with its dynamodb,
sqs and s3 extras plus flask and flask-cors, as `pip install -e ".[dev]"` does), creates the S3
bucket, lets `jobq init` create the DynamoDB table, and runs the quickstart's jobs. Against real
AWS, drop the endpoint and the test credentials from the URLs and use an ElastiCache URL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

from examples.deployment import run

REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("moto's server did not start: pip install 'moto[server]'")
        time.sleep(0.2)


def urls(endpoint: str, name: str) -> dict[str, str]:
    redis = os.environ.get("JOBQ_EXAMPLE_REDIS", "redis://127.0.0.1:6379/0")
    host = endpoint.removeprefix("http://")
    return {
        "store": f"dynamodb://{name}?region={REGION}&endpoint={endpoint}",
        "index": f"{redis}?prefix={name}",
        "broker": f"sqs://testing:testing@{host}?region={REGION}&prefix={name}",
        "history": f"s3://{name}/history?region={REGION}&endpoint={endpoint}&flush_s=1",
    }


def main() -> int:
    name = os.environ.get("JOBQ_EXAMPLE_NAME", f"jobq-example-{uuid.uuid4().hex[:6]}")
    # Credentials come from boto3's usual chain, as in production; moto accepts any.
    for variable, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(variable, value)
    moto, endpoint = start_moto()
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=REGION)
        s3.create_bucket(Bucket=name)
        return run(urls(endpoint, name), "DynamoDB + Redis + SQS + S3 (moto)")
    finally:
        moto.terminate()
        moto.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
