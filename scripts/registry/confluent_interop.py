"""Confluent's own serializers, for the interop tests of parsley-schema.

    confluent_interop.py URL encode TOPIC SCHEMA_JSON   < record as JSON lines
        prints each record framed and encoded by confluent-kafka's
        AvroSerializer (value side, default subject strategy), in hex
    confluent_interop.py URL decode TOPIC                < hex lines
        prints each frame decoded by confluent-kafka's AvroDeserializer,
        which reads the writer schema by the frame's id, as JSON

Run by crates/parsley-schema/tests with the interpreter the test command
prepares (scripts/registry/confluent-python).
"""
import json
import sys

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main():
    url, mode, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    lines = [l.strip() for l in sys.stdin if l.strip()]
    if mode == "encode":
        serializer = AvroSerializer(client, sys.argv[4])
        for line in lines:
            print(serializer(json.loads(line), ctx).hex())
    elif mode == "decode":
        deserializer = AvroDeserializer(client)
        for line in lines:
            print(json.dumps(deserializer(bytes.fromhex(line), ctx), sort_keys=True))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
