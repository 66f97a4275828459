#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/): a few valid inputs
each, encoded here from docs/protocol.md independently of the C++ encoders. Rerun after a format
change: python3 tests/fuzz/make_corpus.py"""
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def u8(v): return struct.pack("<B", v)
def u16(v): return struct.pack("<H", v)
def i16(v): return struct.pack("<h", v)
def u32(v): return struct.pack("<I", v)
def i32(v): return struct.pack("<i", v)
def u64(v): return struct.pack("<Q", v)
def i64(v): return struct.pack("<q", v)
def f64(v): return struct.pack("<d", v)
def f32(v): return struct.pack("<f", v)
def str32(s): b = s.encode() if isinstance(s, str) else s; return u32(len(b)) + b
def str64(s): b = s.encode() if isinstance(s, str) else s; return u64(len(b)) + b


def write(harness, seeds):
    d = os.path.join(ROOT, harness)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


# ---- transport frames: header u16 marker "TP", u8 kind, u8 flags, u32 meta_len, u64 id, u64 payload_len
def header(kind, meta_len, fid, payload_len): return u16(0x5054) + u8(kind) + u8(0) + u32(meta_len) + u64(fid) + u64(payload_len)
def device(t, i): return u8(t) + i16(i)  # u8 type (0 cpu, 1 cuda), u16 index (-1: none)
def tensor(dtype, src, dst, shape, nbytes): return u8(dtype) + src + dst + u8(len(shape)) + b"".join(i64(d) for d in shape) + u64(nbytes)
def meta(name, tensors): return str32(name) + u32(len(tensors)) + b"".join(tensors)

write("frame_header", {
    "request": header(1, 12, 1, 0),
    "response": header(2, 8, 7, 100),
    "error": header(3, 40, 2**63, 5),
    "largest_payload": header(1, 8, 9, 2**31),
    "release": header(4, 8, 3, 0),
    "control": header(4, 21, 0, 16),
})
CPU, CUDA0, CUDA1 = device(0, -1), device(1, 0), device(1, 1)
write("frame_meta", {
    "name_only": meta("echo", []),
    "one_tensor": meta("add", [tensor(7, CPU, CPU, [2, 3], 24)]),
    "cuda_tensors": meta("step", [tensor(4, CUDA0, CUDA1, [4], 32), tensor(9, CPU, CUDA0, [], 1)]),
    "empty_dims": meta("", [tensor(5, CPU, CPU, [0, 5], 0), tensor(0, CPU, CPU, [1, 1, 1, 7], 7)]),
})

# ---- handshake (docs/protocol.md, "Handshake", version 7): u32 magic "TRPC", u16 version, u16 flags,
# u32 body_len; body: str32 name, i32 rank, u32 n transport offers {str32 name, domain, address},
# u32 n channel offers {str32 name, device type, domain, params}, u8 auth [32-byte nonce], u8 step
# [str32 reason | 32-byte proof (step 1) or MAC (step 3)], u8 answer flag [str32 transport, str32 address, u32 n
# {str32 client device type, str32 server device type, str32 channel}]
def hello(name, rank, transports, channels, version=7, auth=False, step=0, reason="", answer=None):
    body = str32(name) + i32(rank) + u32(len(transports))
    body += b"".join(str32(n) + str32(d) + str32(a) for n, d, a in transports)
    body += u32(len(channels)) + b"".join(str32(c[0]) + str32(c[1]) + str32(c[2]) + str32(c[3] if len(c) > 3 else "")
                                          for c in channels)
    body += bytes([1]) + bytes(range(32)) if auth else bytes([0])
    body += bytes([step])
    if step == 2: body += str32(reason)
    if step in (1, 3): body += bytes(range(100, 132))
    if answer is None:
        body += bytes([0])
    else:
        transport, address, pairs = answer
        body += bytes([1]) + str32(transport) + str32(address) + u32(len(pairs))
        body += b"".join(str32(a) + str32(b) + str32(c) for a, b, c in pairs)
    return u32(0x43505254) + u16(version) + u16(0) + u32(len(body)) + body

BASIC = [("basic", "cpu", "any")]
write("hello", {
    "client": hello("worker0", 0, [("uv", "uv", ""), ("uds", "uds:boot/4026531840/0", "")], BASIC),
    "server_answer": hello("worker1", 1, [("uds", "uds:boot/4026531840/0", "uds://tp-worker1-1234"),
                                          ("uv", "uv", "tcp://127.0.0.1:29500")], BASIC,
                           answer=("uds", "uds://tp-worker1-1234", [("cpu", "cpu", "basic")])),
    "keyed_client": hello("trainer17", 17, [], [], auth=True),
    "keyed_server_proof": hello("w", 3, [], [], auth=True, step=1),
    "keyed_client_offers": hello("trainer17", 17, [("uv", "uv", "")], BASIC, auth=True, step=3),
    "keyed_server_offers": hello("w", 3, [("uv", "uv", "tcp://10.0.0.2:1")], BASIC, auth=True, step=3,
                                 answer=("uv", "tcp://10.0.0.2:1", [("cpu", "cpu", "basic")])),
    "refusal": hello("w", 2, [], [], step=2, reason="worker \"x\" is not in this group"),
    "no_rank": hello("", -1, [], []),
    "old_version": hello("w", 3, [("uv", "uv", "")], BASIC, version=3),
    "cma_offer": hello("w", 4, [("uv", "uv", "")], [("cma", "cpu", "cma:boot/pid:[1]/user:[2]", "\x01params"), BASIC[0]]),
})

# ---- c10d requests: a type byte, then u64-length strings, u64 counts, i64 deltas, u32 nonces.
# Legacy (PyTorch 1.13): SET 0, COMPARE_SET 1, GET 2, ADD 3, CHECK 4, WAIT 5, GETNUMKEYS 6,
# WATCH_KEY 7, DELETE_KEY 8. Modern (>= 2.3): VALIDATE 0, SET 1, COMPARE_SET 2, GET 3, ADD 4,
# CHECK 5, WAIT 6, GETNUMKEYS 7, DELETE_KEY 8, APPEND 9, MULTI_GET 10, MULTI_SET 11,
# CANCEL_WAIT 12, PING 13, LIST 17.
def keys(*ks): return u64(len(ks)) + b"".join(str64(k) for k in ks)

LEGACY = dict(set=0, compare_set=1, get=2, add=3, check=4, wait=5, num_keys=6, watch=7, delete=8)
MODERN = dict(validate=0, set=1, compare_set=2, get=3, add=4, check=5, wait=6, num_keys=7, delete=8,
              append=9, multi_get=10, multi_set=11, cancel_wait=12, ping=13, list=17)


def requests(t):
    r = {
        "set": u8(t["set"]) + str64("rank0/addr") + str64("127.0.0.1:29500"),
        "get": u8(t["get"]) + str64("rank0/addr"),
        "add": u8(t["add"]) + str64("counter") + i64(-3),
        "compare_set": u8(t["compare_set"]) + str64("k") + str64("") + str64("first"),
        "check": u8(t["check"]) + keys("a", "b"),
        "wait": u8(t["wait"]) + keys("ready"),
        "num_keys": u8(t["num_keys"]),
        "delete": u8(t["delete"]) + str64("k"),
    }
    if "watch" in t:
        r["watch"] = u8(t["watch"]) + str64("k")
    else:
        r.update({
            "validate": u8(0) + u32(0x3C85F7CE),
            "append": u8(t["append"]) + str64("log") + str64("line\n"),
            "multi_get": u8(t["multi_get"]) + keys("a", "b", "c"),
            "multi_set": u8(t["multi_set"]) + u64(2) + str64("a") + str64("1") + str64("b") + str64("2"),
            "cancel_wait": u8(t["cancel_wait"]),
            "ping": u8(t["ping"]) + u32(0xDEADBEEF),
            "list": u8(t["list"]),
        })
    return r

c10d = {"legacy_" + k: v for k, v in requests(LEGACY).items()}
c10d.update({"modern_" + k: v for k, v in requests(MODERN).items()})
c10d.update({"counter": b"  -9223372036854775808", "counter_plus": b"+42 apples"})
write("c10d_request", c10d)

# ---- device-map record: u32 magic "TPDM", u16 version 1, str32 name, i32 device_count,
# u32 n maps {str32 target, u32 n pairs {device, device}}, u32 n devices {device};
# a device is u8 type and i32 index.
def dev(t, i): return u8(t) + i32(i)
def record(name, count, maps, devices):
    out = u32(0x4D445054) + u16(1) + str32(name) + i32(count) + u32(len(maps))
    for target, pairs in maps:
        out += str32(target) + u32(len(pairs)) + b"".join(dev(*a) + dev(*b) for a, b in pairs)
    return out + u32(len(devices)) + b"".join(dev(*d) for d in devices)

write("device_info", {
    "cpu_only": record("worker0", 0, [], []),
    "two_maps": record("trainer", 2, [("ps", [((1, 0), (1, 1)), ((1, 1), (1, 0))]), ("eval", [((0, -1), (1, 0))])],
                       [(1, 0), (1, 1)]),
    "devices_only": record("w", 8, [], [(1, i) for i in range(8)]),
})

# ---- the same-host channels' and membership's decoders (channel_wire_fuzz.cpp): a selector byte
# (0 cuda_ipc params, 1 ring notice, 2 export notice, 3 reference, 4 cma params, 5 membership
# update, 6 member list), then the encoding.
HANDLE = bytes(range(64))
def ipc_device(index, bus, uuid, outbox=None):
    out = i32(index) + str32(bus) + str32(uuid) + u8(1 if outbox else 0)
    if outbox:
        size, chunk, ring, events, pool_fd = outbox
        out += HANDLE + u64(size) + u64(chunk) + u32(ring) + u32(events) + HANDLE * events + i32(pool_fd)
    return out
def ipc_params(pid, devices): return u8(5) + i32(pid) + u32(len(devices)) + b"".join(devices)
def cma_params(pid):
    return (u8(2) + str32("0f1e2d3c-boot") + str32("pid:[4026531836]") + str32("user:[4026531837]") + u32(1000) * 4 +
            i32(pid) + i32(1) + u8(1) + u8(0) + u8(1) + i32(pid) + u64(0x7f0000001000) + bytes(range(32)) + u64(0x7f0000002000))
def peer_record(name, rank, addresses):
    return u16(5) + str32(name) + i32(rank) + u32(len(addresses)) + b"".join(str32(n) + str32(d) + str32(a) for n, d, a in addresses)
def update(change, subject, members):
    out = u32(0x554D5054) + u8(change) + str32(subject) + u32(len(members))
    for rec, info in members: out += u32(len(rec)) + rec + u32(len(info)) + info
    return out

write("channel_wire", {
    "ipc_offer": u8(0) + ipc_params(4242, [ipc_device(0, "0000:3b:00.0", "GPU-1"), ipc_device(1, "0000:5e:00.0", "")]),
    "ipc_outbox": u8(0) + ipc_params(4242, [ipc_device(1, "0000:5e:00.0", "GPU-2", (1 << 26, 1 << 22, 4, 2, 17))]),
    "ring_free": u8(1) + i32(0) + u64(1 << 20) + u32(3),
    "export": u8(2) + u64(7) + i32(1) + u64(4096) + HANDLE,
    "ref_outbox": u8(3) + u64(4096 << 16 | 3 << 8 | 1),
    "ref_pooled": u8(3) + u64(7 << 16 | 0 << 8 | 5),
    "cma_offer": u8(4) + cma_params(4242),
    "join": u8(5) + update(1, "worker1", [
        (peer_record("worker0", 0, [("uv", "any", "tcp://10.0.0.1:29501")]), record("worker0", 0, [], [])),
        (peer_record("worker1", 1, [("uv", "any", "tcp://10.0.0.2:29501"), ("shm", "host", "shm://tp-1")]),
         record("worker1", 2, [("worker0", [((1, 0), (1, 1))])], [(1, 0)]))]),
    "members": u8(6) + u32(3) + i32(0) + i32(2) + i32(5),
})

# ---- the launcher's environment (launcher_env_fuzz.cpp): a selector byte (even: a Slurm host
# list, odd: a job id, u64, for its port), then the value.
write("launcher_env", {
    "hosts": u8(0) + b"gpu-[01-04,07],login1,rack[1-2]-n[0-1]",
    "plain": u8(0) + b"node1,node2",
    "job": u8(1) + u64(4242424),
})

# ---- typed codecs: a selector byte (typed_codec_fuzz.cpp's switch), then the encoding:
# integers and floats fixed-width little-endian, bool one byte, str u64 length + bytes,
# vec u64 count + elements, map u64 count + key/value pairs, pair first then second.
def vec(items, enc): return u64(len(items)) + b"".join(enc(x) for x in items)
def typed(sig, values): return u8(1) + str64(sig) + values

write("typed_codec", {
    "bool": u8(0) + u8(1),
    "i8": u8(1) + u8(0x80),
    "u16": u8(2) + u16(65535),
    "i32": u8(3) + i32(-7),
    "u64": u8(4) + u64(2**64 - 1),
    "f64": u8(5) + f64(3.25),
    "f32": u8(6) + f32(-0.5),
    "str": u8(7) + str64("hello"),
    "vec_i64": u8(8) + vec([1, -2, 3], i64),
    "vec_bool": u8(9) + vec([1, 0, 1], u8),
    "vec_str": u8(10) + vec(["a", "", "ccc"], str64),
    "vec_vec_u8": u8(11) + vec([b"\x01\x02", b""], lambda b: vec(list(b), u8)),
    "map_str_i64": u8(12) + vec([("a", 1), ("b", -1)], lambda kv: str64(kv[0]) + i64(kv[1])),
    "map_i32_vec_str": u8(13) + vec([(1, ["x"]), (2, [])], lambda kv: i32(kv[0]) + vec(kv[1], str64)),
    "pair_str_f64": u8(14) + str64("pi") + f64(3.14159),
    "vec_pair": u8(15) + vec([("w", [1.0, 2.0])], lambda p: str64(p[0]) + vec(p[1], f32)),
    "nested_map": u8(16) + vec([("outer", [("inner", [(1, "t")])])],
                               lambda kv: str64(kv[0]) + vec(kv[1], lambda kv2: str64(kv2[0]) +
                                                              vec(kv2[1], lambda p: u8(p[0]) + str64(p[1])))),
    "args_i64_str": u8(17) + typed("(i64,str)", i64(5) + str64("five")),
    "reply_i64": u8(17) + typed("i64", i64(5)),
    "args_vec_map": u8(18) + typed("(vec<str>,map<str,f64>)", vec(["a"], str64) + vec([("k", 0.5)], lambda kv: str64(kv[0]) + f64(kv[1]))),
    "args_pair": u8(19) + typed("(pair<vec<i32>,str>)", vec([1, 2], i32) + str64("s")),
    "reply_pair": u8(19) + typed("pair<vec<i32>,str>", vec([1, 2], i32) + str64("s")),
    # Regression: a vec<str> claiming 4000 elements in 4000 bytes reserved 4000 strings (128 KB)
    # before reading the first (the fix reserves what the bytes left could hold).
    "regress_vec_str_claimed_count": u8(10) + u64(4000) + b"\x01" * 4000,
})

# ---- the store server: a byte of options (bit 0: small limits), then operations; an operation
# byte's low two bits say what (0 open, 1 or 2 send, 3 close), bits 2-3 which of four connections,
# bit 4 (open) the modern dialect; a send is followed by a length byte and that many bytes.
def op_open(slot, modern=False): return u8(0 | slot << 2 | (16 if modern else 0))
def op_send(slot, data):
    out = b""
    for i in range(0, len(data), 255):
        chunk = data[i:i + 255]
        out += u8(1 | slot << 2) + u8(len(chunk)) + chunk
    return out
def op_close(slot): return u8(3 | slot << 2)

L = requests(LEGACY)
M = requests(MODERN)
write("store_server", {
    "set_get": u8(0) + op_open(0) + op_send(0, L["set"] + L["get"] + L["num_keys"]),
    "wait_wakes_other": u8(0) + op_open(0) + op_open(1) + op_send(1, L["wait"]) +
        op_send(0, u8(LEGACY["set"]) + str64("ready") + str64("1")) + op_close(1) + op_close(0),
    "watch_then_close": u8(0) + op_open(2) + op_send(2, L["watch"]) + op_open(3) +
        op_send(3, u8(LEGACY["set"]) + str64("k") + str64("v")) + op_close(2) + op_send(3, L["delete"]),
    "modern_session": u8(1) + op_open(0, True) + op_send(0, M["validate"] + M["set"] + M["multi_get"] + M["append"] +
        M["append"] + M["add"] + M["ping"] + M["list"]) + op_open(1, True) + op_send(1, M["validate"] + M["wait"] +
        M["cancel_wait"]) + op_close(0) + op_open(0, True) + op_send(0, M["validate"] + M["multi_set"] + M["check"]),
    "split_request": u8(0) + op_open(0) + op_send(0, L["compare_set"][:5]) + op_send(0, L["compare_set"][5:]) +
        op_send(0, L["add"] + L["add"]),
    "bad_request_closes": u8(1) + op_open(0) + op_open(1) + op_send(1, L["wait"]) + op_send(0, u8(200)) +
        op_open(0) + op_send(0, u8(LEGACY["add"]) + str64("x") + i64(1)),
})

# ---- the shm setup: a shape byte (bits 0-3: descriptor count mod 9; bit 4: descriptors on the
# second piece; bit 5: half-close), per descriptor a kind byte (0 ring memfd: capacity, shape and a
# scribble count follow; 1 and 2 eventfd: a flags byte follows; 3 pipe, 4 /dev/null, 5 plain memfd,
# 6 socket), a max-capacity byte, 32 bytes xored into a valid message, a trailing-length byte and a
# split byte.
def ring(capacity_log=0): return u8(0) + u8(capacity_log) + u8(0) + u8(0)
def bell(): return u8(1) + u8(0)
def setup(shape, fds, max_log=0, mix=b"", trailing=0, split=0):
    return u8(shape) + b"".join(fds) + u8(max_log) + (mix + bytes(32))[:32] + u8(trailing) + u8(split)
write("shm_setup", {
    "valid": setup(3, [ring(), bell(), bell()]),
    "valid_larger_ring": setup(3, [ring(2), bell(), bell()], max_log=3),
    "valid_in_two_pieces": setup(3, [ring(), bell(), bell()], split=5),
    "descriptors_late": setup(3 | 16, [ring(), bell(), bell()], split=5),
    "ring_over_bound": setup(3, [ring(3), bell(), bell()], max_log=1),
    "pipe_for_bell": setup(3, [ring(), bell(), u8(3)]),
    "half_closed_short": setup(3 | 32, [ring(), bell(), bell()], trailing=0, split=20),
    "too_many": setup(5, [ring(), bell(), bell(), u8(4), u8(6)]),
    "unsealed": setup(3, [u8(0) + u8(0) + u8(0x80) + u8(0), bell(), bell()]),
    "bad_magic": setup(3, [ring(), bell(), bell()], mix=b"\xff"),
})
