"""Sets up a moto server started with authentication after the first
1 + 3 * USERS requests (INITIAL_NO_AUTH_ACTION_COUNT): makes the bucket,
then one IAM user per policy, and prints their access keys as JSON,
{"name": ["key id", "secret"], ...}. From then on every request is signed
and judged by its user's policy.

usage: users.py ENDPOINT BUCKET < '{"name": POLICY, ...}'
"""

import json
import sys

import boto3


def main() -> None:
    endpoint, bucket = sys.argv[1], sys.argv[2]
    policies = json.load(sys.stdin)
    unsigned = dict(
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    boto3.client("s3", **unsigned).create_bucket(Bucket=bucket)
    iam = boto3.client("iam", **unsigned)
    keys = {}
    for name, policy in policies.items():
        iam.create_user(UserName=name)
        iam.put_user_policy(
            UserName=name, PolicyName=f"{name}-store", PolicyDocument=json.dumps(policy)
        )
        key = iam.create_access_key(UserName=name)["AccessKey"]
        keys[name] = [key["AccessKeyId"], key["SecretAccessKey"]]
    json.dump(keys, sys.stdout)


if __name__ == "__main__":
    main()
