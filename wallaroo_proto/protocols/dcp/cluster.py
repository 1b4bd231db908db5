"""The bucket config a data node gives clients: GET_CLUSTER_CONFIG's answer and NOT_MY_VBUCKET's body.

A one-node cluster on the producer's KV port, every vbucket active on it. The
shape is what clients read from a real node (``rev``/``revEpoch``,
``nodeLocator: vbucket``, ``vBucketServerMap`` with one list per vbucket,
``nodesExt`` with the services' ports); the node's own entry in ``nodesExt``
carries no ``hostname``, as a node leaves it out for the address the client
already used, and ``serverList`` names the address the client connected to.
"""

from __future__ import annotations

import json

#: The capabilities a Couchbase bucket of this version announces that matter to a DCP client.
CAPABILITIES = ("dcp", "cbhello", "touch", "cccp", "xattr", "nodesExt", "xdcrCheckpointing")


def bucket_config(name: str, uuid: str, vbuckets: int, host: str, port: int, rev: int = 1) -> bytes:
    """The bucket config JSON for ``vbuckets`` vbuckets served at ``host:port``."""
    server = f"{host}:{port}"
    config = {
        "rev": rev,
        "revEpoch": 1,
        "name": name,
        "uuid": uuid,
        "bucketType": "membase",
        "nodeLocator": "vbucket",
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": list(CAPABILITIES),
        "collectionsManifestUid": "0",
        "ddocs": {"uri": f"/pools/default/buckets/{name}/ddocs"},
        "nodes": [
            {
                "couchApiBase": f"http://{host}:8092/{name}",
                "hostname": f"{host}:8091",
                "ports": {"direct": port},
            }
        ],
        "nodesExt": [{"services": {"kv": port, "mgmt": 8091}, "thisNode": True}],
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 0,
            "serverList": [server],
            "vBucketMap": [[0]] * vbuckets,
        },
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {"n1ql": ["enhancedPreparedStatements"]},
    }
    return json.dumps(config, separators=(",", ":")).encode()
