"""moto's Kinesis and DynamoDB emulator as a WSGI app, for an HTTP/2-capable server (hypercorn):
the KCL's Kinesis client speaks cleartext HTTP/2, which moto's own server does not.

Resharding is made to behave as real Kinesis does, which is what the KCL's shard end rests on:
- a split or merged shard keeps its records (moto moves them into the children, so a reader
  would see them twice), and records put after it go to the open shards only;
- GetRecords on a closed shard whose records are all read returns no NextShardIterator and the
  shard's ChildShards (moto always returns an iterator, so a closed shard never ends).
"""

from collections import OrderedDict
from hashlib import md5

from moto.core.responses import ActionResult
from moto.kinesis.models import Shard, Stream
from moto.kinesis.responses import KinesisResponse
from moto.kinesis.utils import decompose_shard_iterator
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

_split_shard = Stream.split_shard
_merge_shards = Stream.merge_shards
_get_shard_for_key = Stream.get_shard_for_key


def split_shard(self: Stream, shard_to_split: str, new_starting_hash_key: str) -> None:
    """moto's split (its checks, its two children), but the parent keeps its records."""
    parent = self.shards[shard_to_split]
    kept = OrderedDict(parent.records)
    put_record, self.put_record = self.put_record, lambda *args, **kwargs: None
    try:
        _split_shard(self, shard_to_split, new_starting_hash_key)
    finally:
        self.put_record = put_record
    parent.records = kept


def merge_shards(self: Stream, shard_to_merge: str, adjacent_shard_to_merge: str) -> None:
    """moto's merge, but the child starts empty: the parents keep their records."""
    before = set(self.shards)
    _merge_shards(self, shard_to_merge, adjacent_shard_to_merge)
    for shard_id in set(self.shards) - before:
        self.shards[shard_id].records = OrderedDict()


def get_shard_for_key(self: Stream, partition_key: str, explicit_hash_key: str) -> Shard | None:
    """moto's checks, then the open shard whose hash key range holds the key."""
    _get_shard_for_key(self, partition_key, explicit_hash_key)
    key = int(explicit_hash_key) if explicit_hash_key else int(md5(partition_key.encode()).hexdigest(), 16)
    return next(
        (s for s in self.shards.values() if s.is_open and s.starting_hash <= key <= s.ending_hash), None
    )


def _children(stream: Stream, shard: Shard) -> list[dict]:
    return [
        {
            "ShardId": child.shard_id,
            "ParentShards": [p for p in (child.parent, child.adjacent_parent) if p],
            "HashKeyRange": {
                "StartingHashKey": str(child.starting_hash),
                "EndingHashKey": str(child.ending_hash),
            },
        }
        for child in stream.shards.values()
        if shard.shard_id in (child.parent, child.adjacent_parent)
    ]


def get_records(self: KinesisResponse) -> ActionResult:
    """moto's GetRecords, ending a closed shard once its last record is read."""
    stream_arn = self._get_param("StreamARN")
    iterator = self._get_param("ShardIterator")
    following, records, millis_behind = self.kinesis_backend.get_records(
        stream_arn, iterator, self._get_param("Limit")
    )
    stream_name, shard_id, _ = decompose_shard_iterator(iterator)
    stream = self.kinesis_backend.describe_stream(stream_arn=stream_arn, stream_name=stream_name)
    shard = stream.get_shard(shard_id)
    body = {"Records": [record.to_json() for record in records], "MillisBehindLatest": millis_behind}
    read_up_to = int(decompose_shard_iterator(following)[2])
    if not shard.is_open and read_up_to >= shard.get_max_sequence_number():
        body["ChildShards"] = _children(stream, shard)
    else:
        body["NextShardIterator"] = following
    return ActionResult(body)


Stream.split_shard = split_shard
Stream.merge_shards = merge_shards
Stream.get_shard_for_key = get_shard_for_key
KinesisResponse.get_records = get_records

app = DomainDispatcherApplication(create_backend_app)
