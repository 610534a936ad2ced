"""Confluent's own serializers, for the interop tests of parsley-schema.

    confluent_interop.py URL encode TOPIC SCHEMA_JSON [CONF_JSON] < record as JSON lines
        prints each record framed and encoded by confluent-kafka's
        AvroSerializer (value side, default subject strategy), in hex;
        CONF_JSON is the serializer's configuration (normalize.schemas...)
    confluent_interop.py URL decode TOPIC                < hex lines
        prints each frame decoded by confluent-kafka's AvroDeserializer,
        which reads the writer schema by the frame's id, as JSON
    confluent_interop.py URL resolve TOPIC               < one case as JSON
        the case is {"writer": schema, "reader": schema, "references":
        [{"name", "subject", "schema"}], "records": [...]}: registers the
        references, encodes each record with the writer schema (which may
        name them), decodes the frame with AvroDeserializer given the
        reader schema, and prints, per record, a JSON line with the frame
        and the reader's value written back in the reader schema (both in
        hex) and that value as text. In records, {"$bytes": hex} is bytes,
        {"$decimal": "1.25"} a decimal and {"$branch": [name, value]} picks
        a union's named branch.

Run by crates/parsley-schema/tests with the interpreter the test command
prepares (scripts/registry/confluent-python).
"""
import decimal
import io
import json
import sys

from fastavro import parse_schema, schemaless_writer

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main():
    url, mode, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    client = SchemaRegistryClient({"url": url})
    ctx = SerializationContext(topic, MessageField.VALUE)
    lines = [l.strip() for l in sys.stdin if l.strip()]
    if mode == "encode":
        conf = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
        serializer = AvroSerializer(client, sys.argv[4], conf=conf)
        for line in lines:
            print(serializer(json.loads(line), ctx).hex())
    elif mode == "decode":
        deserializer = AvroDeserializer(client)
        for line in lines:
            print(json.dumps(deserializer(bytes.fromhex(line), ctx), sort_keys=True))
    elif mode == "resolve":
        resolve(client, ctx, json.loads("\n".join(lines)))
    else:
        sys.exit("unknown mode " + mode)


def from_json(v):
    if isinstance(v, dict):
        if set(v) == {"$bytes"}:
            return bytes.fromhex(v["$bytes"])
        if set(v) == {"$decimal"}:
            return decimal.Decimal(v["$decimal"])
        if set(v) == {"$branch"}:
            name, value = v["$branch"]
            return (name, from_json(value))
        return {k: from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [from_json(x) for x in v]
    return v


def resolve(client, ctx, case):
    references = []
    for r in case.get("references", []):
        registered = client.register_schema(r["subject"], Schema(r["schema"], "AVRO"))
        version = client.lookup_schema(r["subject"], Schema(r["schema"], "AVRO")).version
        references.append(SchemaReference(r["name"], r["subject"], version))
        del registered
    writer = Schema(case["writer"], "AVRO", references)
    serializer = AvroSerializer(client, writer)
    reader = Schema(case["reader"], "AVRO")
    deserializer = AvroDeserializer(client, reader, return_record_name=True)
    parsed = parse_schema(json.loads(case["reader"]))
    for record in case["records"]:
        frame = serializer(from_json(record), ctx)
        value = deserializer(frame, ctx)
        out = io.BytesIO()
        schemaless_writer(out, parsed, value)
        print(json.dumps({
            "frame": frame.hex(),
            "read": out.getvalue().hex(),
            "value": json.dumps(value, default=repr, sort_keys=True),
        }))


if __name__ == "__main__":
    main()
