"""Prints every message of a topic as JSON lines, read with confluent-kafka.

Usage: read_topic.py BOOTSTRAP TOPIC [ISOLATION]

Partitions are assigned by hand and read from offset 0 up to their high watermark
(consumer-group joins are slow on tansu), with isolation.level=read_committed, as every
consumer of the intake's topic must read (the intake produces in transactions), unless
ISOLATION says read_uncommitted (to tell, when a check fails, what the broker holds from
what it shows). Keys and values are printed as hex so the caller compares bytes, not
decoded text; each partition's watermarks go to standard error.
"""

import json
import sys
import time

from confluent_kafka import Consumer, TopicPartition

bootstrap, topic = sys.argv[1], sys.argv[2]
isolation = sys.argv[3] if len(sys.argv) > 3 else "read_committed"
consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "operations-intake-tests",
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "isolation.level": isolation,
})
partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
remaining = set()
assignment = []
for p in partitions:
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
    print(f"partition {p}: offsets {low} to {high} ({isolation})", file=sys.stderr)
    if high > 0:
        remaining.add(p)
        assignment.append(TopicPartition(topic, p, 0))
consumer.assign(assignment)
deadline = time.time() + 30
while remaining and time.time() < deadline:
    message = consumer.poll(0.5)
    if message is None:
        continue
    if message.error():
        if message.error().code() == message.error()._PARTITION_EOF:
            remaining.discard(message.partition())
            continue
        raise SystemExit(f"read error: {message.error()}")
    print(json.dumps({
        "partition": message.partition(),
        "offset": message.offset(),
        "key": (message.key() or b"").hex(),
        "value": (message.value() or b"").hex(),
        "headers": [[k, v.decode()] for k, v in (message.headers() or [])],
    }))
if remaining:
    raise SystemExit(f"partitions {sorted(remaining)} not read to the end in time")
consumer.close()
