"""The bucket config a data node gives clients: GET_CLUSTER_CONFIG's answer and NOT_MY_VBUCKET's body.

A cluster of the producer's KV ports (one node, or a second one a vbucket moves
to), each vbucket active on one of them, no replicas. The shape is what clients
read from a real node (``rev``/``revEpoch``,
``nodeLocator: vbucket``, ``vBucketServerMap`` with one list per vbucket,
``nodesExt`` with the services' ports); the node's own entry in ``nodesExt``
carries no ``hostname``, as a node leaves it out for the address the client
already used (the others name theirs), and ``serverList`` names the nodes at
the address the client connected to.
"""

from __future__ import annotations

import json

#: The capabilities a Couchbase bucket of this version announces that matter to a DCP client.
CAPABILITIES = ("dcp", "cbhello", "touch", "cccp", "xattr", "nodesExt", "xdcrCheckpointing")


def bucket_config(
    name: str,
    uuid: str,
    vbucket_map: list[int],
    host: str,
    ports: list[int],
    this_node: int = 0,
    rev: int = 1,
) -> bytes:
    """The bucket config: vbucket ``i`` active on node ``vbucket_map[i]``, node ``k`` at ``host:ports[k]``.

    ``this_node`` is the node answering; ``rev`` grows with each change of the map.
    """
    nodes_ext: list[dict] = []
    for k, port in enumerate(ports):
        node: dict = {"services": {"kv": port, "mgmt": 8091 + k}}
        if k == this_node:
            node["thisNode"] = True
        else:
            node["hostname"] = host
        nodes_ext.append(node)
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
                "hostname": f"{host}:{8091 + k}",
                "ports": {"direct": port},
            }
            for k, port in enumerate(ports)
        ],
        "nodesExt": nodes_ext,
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 0,
            "serverList": [f"{host}:{port}" for port in ports],
            "vBucketMap": [[k] for k in vbucket_map],
        },
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {"n1ql": ["enhancedPreparedStatements"]},
    }
    return json.dumps(config, separators=(",", ":")).encode()
