"""moto's S3 server on a free loopback port, holding captures, for the object-storage tests.

The server runs in a thread of the test process; spark-replay, its Python
workers and a standalone cluster's executors reach it over loopback with the
AWS SDK's own settings, which ``env`` holds: ``AWS_ENDPOINT_URL_S3`` and an
access key. Once filled, the server checks every request against IAM (moto's
``reset-auth``): the key is a user's whose policy allows everything in S3 but
reading the objects named ``denied``, so a denied read is S3's own answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REGION = "us-east-1"


@dataclass
class S3:
    url: str  # the endpoint, http://127.0.0.1:PORT
    env: dict[str, str]  # what a process sets to read the bucket as the reader


@contextlib.contextmanager
def serve(
    tmp: Path, objects: Mapping[str, bytes], denied: tuple[str, ...] = (), bucket: str = "caps"
) -> Iterator[S3]:
    """Serve ``objects`` (key -> bytes) in ``bucket``; reading the keys in ``denied`` is refused."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        _post(f"{url}/moto-api/reset", b"")  # moto's state is the process's: another module's is gone
        # No one's own AWS configuration: only what is set here counts.
        isolated = {
            "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "none"),
        }
        admin = {"endpoint_url": url, "region_name": REGION}
        admin |= {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
        s3 = boto3.client("s3", **admin)
        s3.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        iam = boto3.client("iam", **admin)
        iam.create_user(UserName="reader")
        statements = [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]
        if denied:
            arns = [f"arn:aws:s3:::{bucket}/{key}" for key in denied]
            statements.append({"Effect": "Deny", "Action": "s3:GetObject", "Resource": arns})
        policy = json.dumps({"Version": "2012-10-17", "Statement": statements})
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=policy)
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        _post(f"{url}/moto-api/reset-auth", b"0")  # from now on every request is checked
        env = {
            "AWS_ENDPOINT_URL_S3": url,
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
            "AWS_DEFAULT_REGION": REGION,
            **isolated,
        }
        yield S3(url, env)
    finally:
        server.stop()
        from moto import settings

        settings.INITIAL_NO_AUTH_ACTION_COUNT = float("inf")  # as it was: the setting is the process's


def _post(url: str, body: bytes) -> None:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request, timeout=60).read()
