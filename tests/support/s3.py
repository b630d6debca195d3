"""A local S3-compatible server for tests: moto's, in a thread of the test process, on a free port.

Spoken to over HTTP by boto3 exactly as a deployment's MinIO or AWS would be, so a child process
(a `job` command, a crash driver) reaches it too with ``DURABLE_S3_ENDPOINT_URL`` and any key.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .network import free_port

#: moto accepts any credentials; boto3 refuses to sign without some.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@contextmanager
def s3_server() -> Iterator[str]:
    """The endpoint URL of a fresh server, stopped afterwards."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )
    if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
        client.create_bucket(Bucket=bucket)
