#!/usr/bin/python3
"""fuzz/make_corpus.py: writes the seed corpus of fuzz/rpc_decode into fuzz/corpus/rpc_decode.

Valid requests of several methods (both vector encodings, every parameter type), a
notification, responses, pipelined messages, and edge cases the scanner and decoder must
refuse (forged lengths, reserved byte, deep nesting, bad UTF-8, wrong shapes). Rerun after
changing it and commit the files; the fuzzer itself never writes there.
"""
import os
import struct
import sys

import msgpack

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "rpc_decode")


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def req(msgid, method, args=None):
    return pack([0, msgid, method, [] if args is None else [args]])


def f32le(vals):
    return struct.pack("<%df" % len(vals), *vals)


SEEDS = {
    # valid requests
    "ping": req(1, "ping"),
    "auth": req(2, "auth", {"api_key": "ek_0123456789abcdef"}),
    "memory_store": req(3, "memory.store", {
        "content": "the quick brown fox \u20ac", "type": "fact", "importance": 0.75,
        "metadata": {"source": "chat", "n": 3, "nested": [1, None, {"k": "v"}]},
        "embedding": f32le([0.5, -1.0, 2.0, 0.0]), "agent_id": 7, "scope": "agent",
        "created_at": 1700000000000, "ttl_seconds": 3600, "pinned": True}),
    "memory_store_array_vector": req(4, "memory.store", {
        "content": "x", "type": "event", "importance": 0,
        "embedding": [0.25, -2, 3, 1.5], "metadata": None}),
    "memory_search": req(4000000000, "memory.search", {
        "query": "fox", "top_k": 10, "mode": "hybrid", "similarity_weight": 0.5,
        "tags": ["a", "bb"], "ids": [1, 2, 18446744073709551615]}),
    "memory_search_vector": req(5, "memory.search", {
        "embedding": f32le([0.1] * 16), "top_k": 1}),
    "session_append": req(6, "session.append", {
        "session_id": 42, "role": "user", "content": "", "tokens": 12, "cost_usdc": 0.002}),
    "every_type": req(7, "x.test", {
        "content": "c", "top_k": 5, "embedding": None, "weight": -3.5, "flag": False,
        "offset": -9, "tags": ["t"], "ids": [0], "meta": {"a": 1}, "list": [1, "two", 3.0],
        "blob": b"\x00\x01\x02", "any": {"deep": [[{"x": b"y"}]]}}),
    "wide_encodings": req(65536, "memory.store", {
        "content": "w" * 300, "type": "fact", "importance": 1.0,
        "metadata": {str(i): i for i in range(20)}}),
    "notification": pack([2, "log", [{"content": "hello"}]]),
    "pipelined": req(8, "ping") + req(9, "auth", {"api_key": "k"}) + req(10, "ping"),
    # responses
    "response_result": pack([1, 9, None, {"id": 123, "content": "x"}]),
    "response_error": pack([1, 10, {"code": "rate_limited", "message": "slow down",
                                    "limit": 5}, None]),
    # edge cases, refused somewhere
    "unknown_parameter": req(11, "auth", {"api_key": "k", "extra": 1}),
    "missing_required": req(12, "memory.store", {"content": "x"}),
    "nan_vector": req(13, "memory.search", {"embedding": f32le([float("nan"), 1.0])}),
    "odd_vector_length": req(14, "memory.search", {"embedding": b"\x00" * 7}),
    # a UTF-16 surrogate encoded in a str (Python cannot pack one: patched in)
    "bad_utf8_content": req(15, "memory.store", {
        "content": "@@@", "type": "fact", "importance": 1}).replace(b"@@@", b"\xed\xa0\x80"),
    "nul_in_string": req(16, "auth", {"api_key": "a\x00b"}),
    "ext_value": req(17, "x.test", {"any": msgpack.ExtType(3, b"xy")}),
    "params_not_map": pack([0, 18, "ping", [[1, 2]]]),
    "non_string_key": pack([0, 19, "ping", [{1: 2}]]),
    "method_empty": pack([0, 20, "", []]),
    "msgid_negative": pack([0, -1, "ping", []]),
    "kind_unknown": pack([3, 21, "ping", []]),
    "request_3_elements": pack([0, 22, "ping"]),
    "reserved_c1": b"\x94\x00\x17\xc1",
    "truncated": req(23, "auth", {"api_key": "abcdef"})[:-3],
    "str32_forged_length": b"\x94\x00\x18\xa4ping\x91\x81\xa7content\xdb\xff\xff\xff\xff",
    "array32_forged_count": b"\x94\x00\x19\xa4ping\xdd\x7f\xff\xff\xff",
    "map32_forged_count": b"\x94\x00\x1a\xa4ping\x91\xdf\x00\x10\x00\x00",
    "deep_nesting": b"\x94\x00\x1b\xa4ping\x91\x81\xa3any" + b"\x91" * 40 + b"\xc0",
    "trailing_bytes": req(28, "ping") + b"\xc0",
    "empty_map_args": req(29, "ping", {}),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("%d seeds in %s" % (len(SEEDS), OUT), file=sys.stderr)


if __name__ == "__main__":
    main()
