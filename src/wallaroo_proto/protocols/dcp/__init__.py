"""Couchbase DCP (Database Change Protocol, ex-UPR) over the memcached binary protocol."""
