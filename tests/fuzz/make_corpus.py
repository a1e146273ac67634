#!/usr/bin/env python3
"""Write the hand-made seeds of tests/fuzz/corpus/ (seed-*) for fuzz_api.c.

Each seed is a byte string laid out the way fuzz_api.c reads its input, so
that every feature (each dtype pair, page sizes, q_len, explicit and identity
page tables, forced / deterministic splits, long sequences, caller workspace)
and every kind of hostile value has at least one input that reaches it. The
fuzzer mutates from there. If the harness's input layout changes, update the
Layout helpers below and rerun:

    python3 tests/fuzz/make_corpus.py tests/fuzz/corpus
"""
import os
import struct
import sys

# ---- value tables of fuzz_api.c (index = position in the harness's list) ----
HEADS = [1, 2, 3, 4, 5, 7, 8, 16, 1, 2, 16, 11, 32, 64, 100, 128]
BAD_HEADS = [0, -1, 129, -2**31, 2**31 - 1]
DTYPE = [0, 1, 2, 3, 4]
BAD_DTYPE = [5, 6, 7, 8, 255, -1, 0x7fffffff, 256]
OUT = [0, 1]
BAD_OUT = [2, 3, 4, 5, 6, -1, 99]
PS = [1, 16, 64, 0, 2, 4, 8, 32, 128, 256]
BAD_PS = [-1, 3, 6, 48, 257, 512, 1024, -2**31, 0x40000000]
MB = [4, 1, 2, 3, 8, 16, 5, 0]
BAD_MB = [-1, 65537, -2**31, 2**31 - 1, 1 << 20]
MQ = [1, 0, 2, 4, 8, 3]
BAD_MQ = [9, -1, 16, -2**31]
SP = [0, 0, 0, 1, 2, 3, 7, 64]
BAD_SP = [-1, 65, -2**31, 2**31 - 1]
BE = [1, 0]  # CPU, AUTO
BAD_BE = [3, -1, 255]
TH = [1, 2, 1, 2, 3, 0]
BAD_TH = [-1, 1025, -2**31]
STRIDE = [0, 0, 0, 18, 19, 32, 64]
BAD_STRIDE = [17, 1, -1, 4097, -2**31]

DT = {"bf16": 1, "fp8": 2, "fnuz": 3, "mxfp4": 4}


def ok(table, value):
    """Byte that selects `value` from a harness `ok` list."""
    return bytes([table.index(value)])


def bad(table, value):
    """Bytes that select `value` from a harness `bad` list: 255, then c >= 32
    with c % len == index."""
    i = table.index(value)
    c = next(c for c in range(32, 256) if c % len(table) == i)
    return bytes([255, c])


class Seed:
    def __init__(self):
        self.b = bytearray()

    def u8(self, *vals):
        self.b += bytes(vals)
        return self

    def raw(self, data):
        self.b += data
        return self


def desc(s, heads=16, q="bf16", kv="bf16", ps=64, mb=4, mq=1, splits=0, flags=0, threads=2,
         fsel=None, ssel=0, csel=0, dsel=0, bad_field=None):
    """Descriptor bytes. bad_field = (name, value) puts one hostile value in."""
    fsel = flags if fsel is None else fsel
    s.u8(fsel, ssel, csel, dsel)

    def field(name, table, bad_table, value):
        if bad_field and bad_field[0] == name:
            s.raw(bad(bad_table, bad_field[1]))
        else:
            s.raw(ok(table, value))

    field("heads", HEADS, BAD_HEADS, heads)
    s.u8(0)  # head_dim_qk default
    s.u8(0)  # head_dim_v default
    field("q", DTYPE, BAD_DTYPE, DT.get(q, 0))
    field("kv", DTYPE, BAD_DTYPE, DT.get(kv, 0))
    field("out", OUT, BAD_OUT, 0)
    field("ps", PS, BAD_PS, ps)
    field("mb", MB, BAD_MB, mb)
    field("mq", MQ, BAD_MQ, mq)
    field("sp", SP, BAD_SP, splits)
    field("be", BE, BAD_BE, 1)
    field("th", TH, BAD_TH, threads)
    s.u8(0)  # desc struct_size: exact
    return s


def prologue(seed_value):
    s = Seed()
    s.raw(struct.pack("<Q", seed_value))
    s.u8(3)  # api odds and ends
    return s


def execute(s, mode=0, mode2=0, mode3=0, stride=0, qs=0, kvs=0, pages=0, table=None, num_pages=0, ws=0,
            tsize=0):
    """One execute call. pages: the page-count byte; table: explicit table
    bytes (mode bit 0 set); num_pages, ws, tsize: their selector bytes."""
    if table is not None:
        mode |= 1
    s.u8(mode, mode2, mode3)
    s.raw(ok(STRIDE, stride) if not isinstance(stride, tuple) else bad(BAD_STRIDE, stride[1]))
    s.u8(qs, kvs, pages)
    if table is not None:
        s.raw(bytes(table))
    s.u8(num_pages, ws, tsize)
    return s


def no_metadata_execute(s):
    s.u8(0, 0, 0)  # the execute before any metadata reads its three mode bytes
    return s


def batch(s, seqs, mode=0, info=0, execs=1):
    """seqs: list of (q_len byte, pages byte, last byte, *extra bytes)."""
    s.u8(mode, len(seqs))
    for q in seqs:
        s.u8(*q)
    s.u8(0)  # batch struct_size exact
    s.u8(info)  # schedule info struct_size (read only after success)
    s.u8(execs - 1)
    return s


def write(out, name, data):
    with open(os.path.join(out, "seed-" + name), "wb") as f:
        f.write(bytes(data))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    n = 0

    # Every dtype pair the library accepts, one small ragged batch each.
    pairs = [("bf16", "bf16"), ("bf16", "fp8"), ("bf16", "fnuz"), ("bf16", "mxfp4"), ("fp8", "bf16"),
             ("fp8", "fp8"), ("fp8", "mxfp4"), ("fnuz", "bf16"), ("fnuz", "fnuz"), ("fnuz", "mxfp4")]
    for i, (q, kv) in enumerate(pairs):
        ps = [1, 16, 64, 256, 2, 4, 8, 32, 128, 1][i]
        s = prologue(0x1000 + i)
        desc(s, heads=[1, 2, 3, 16, 4, 5, 7, 8, 11, 2][i], q=q, kv=kv, ps=ps, mb=8, mq=[1, 2, 4, 8, 3][i % 5])
        no_metadata_execute(s)
        s.u8(0)  # one step
        batch(s, [(1, 3, 7), (0, 2, 1), (1, 0, 0), (2, 1, 200)], execs=2)
        execute(s, mode=4, qs=1, kvs=1, pages=1)
        execute(s, qs=3, kvs=4, pages=2, table=None)
        write(out, "pair-%s-%s" % (q, kv), s.b)
        n += 1

    # Explicit page tables, shuffled, and num_pages = 0 (unchecked, all valid).
    for i, ps in enumerate([1, 16, 256]):
        s = prologue(0x2000 + i)
        desc(s, heads=8, q="bf16", kv=["bf16", "fp8", "mxfp4"][i], ps=ps, mb=4, mq=2)
        no_metadata_execute(s)
        s.u8(0)
        batch(s, [(2, 5, 3), (1, 2, 9)])
        npages = [7, 2, 2][i] if ps > 1 else 7
        execute(s, pages=10, table=[3, 1, 4, 1, 5, 9, 2][:npages], num_pages=210 if i == 2 else 0)
        write(out, "explicit-table-ps%d" % ps, s.b)
        n += 1

    # Long sequences: > 64 blocks of 64 tokens, forced 64 splits, deterministic, balanced.
    for name, splits, flags in [("forced64", 64, 0), ("deterministic", 0, 1), ("balanced", 0, 0),
                                ("forced7-callerws", 7, 4)]:
        s = prologue(0x3000 + splits + flags)
        desc(s, heads=1, q="bf16", kv="bf16", ps=64, mb=2, mq=1, splits=splits, flags=flags, threads=2)
        no_metadata_execute(s)
        s.u8(0)
        # ck = 240 selects a long sequence: 65 + byte*16 + (byte & 15) tokens
        batch(s, [(1, 240, 10, 255, 15), (1, 1, 5)])
        execute(s, pages=0, ws=0)
        write(out, "long-%s" % name, s.b)
        n += 1

    # Hostile descriptor fields (each one alone).
    for field, value in [("heads", 0), ("heads", 129), ("q", 255), ("kv", 5), ("kv", 256), ("out", 2),
                         ("ps", 3), ("ps", 512), ("mb", -1), ("mb", 65537), ("mq", 9), ("sp", 65), ("be", 3),
                         ("th", 1025)]:
        s = prologue(0x4000)
        desc(s, bad_field=(field, value))
        write(out, "bad-desc-%s-%d" % (field, value), s.b)
        n += 1
    # fp8 flavour mismatch, MXFP4 Q, GPU backend on a CPU-only build, unknown flag, NaN sm_scale
    for name, kw in [("fp8-mismatch", dict(q="fp8", kv="fnuz")), ("mxfp4-q", dict(fsel=0xf0)),
                     ("gpu-backend", dict(dsel=0xf8)), ("unknown-flag", dict(fsel=0xe9)),
                     ("nan-sm-scale", dict(ssel=249)), ("negative-cap", dict(csel=246)),
                     ("negative-device", dict(dsel=0xe0)), ("big-sm-scale", dict(ssel=241))]:
        s = prologue(0x4100)
        desc(s, **kw)
        no_metadata_execute(s)
        s.u8(0)
        batch(s, [(1, 2, 3)])
        execute(s)
        write(out, "desc-%s" % name, s.b)
        n += 1

    # Hostile batches.
    for name, seqs, mode in [
        ("decreasing-qo", [(1, 1, 1), (253, 1, 1)], 0),
        ("decreasing-kv", [(1, 1, 1), (1, 250, 1)], 0),
        ("kv-indptr-int32-max", [(1, 252, 1)], 0),
        ("kv-len-above-2e31", [(1, 254, 1)], 0),
        ("last-page-len-0", [(1, 2, 248)], 0),
        ("last-page-len-big", [(1, 2, 251)], 0),
        ("q-len-over-limit", [(250, 1, 1)], 0),
        ("qo-indptr-0-is-1", [(1, 1, 1)], 251),
        ("kv-indptr-0-is-1", [(1, 1, 1)], 250 | 2),
        ("null-qo", [(1, 1, 1)], 240),
        ("memory-device", [(1, 1, 1)], 242),
        ("memory-invalid", [(1, 1, 1)], 243),
        ("null-last-page-len", [(1, 3, 1), (2, 1, 1)], 0x18),
    ]:
        s = prologue(0x5000)
        desc(s, heads=4, ps=16, mb=4, mq=2)
        no_metadata_execute(s)
        s.u8(1)  # two steps: the bad one, then a good one
        batch(s, seqs, mode=mode)
        execute(s)
        batch(s, [(1, 2, 3)])
        execute(s)
        write(out, "batch-%s" % name, s.b)
        n += 1
    s = prologue(0x5100)
    desc(s, heads=4, ps=16, mb=4)
    no_metadata_execute(s)
    s.u8(0)
    s.u8(0, 252)  # batch_size = max_batch + 1
    s.u8(0, 0, 0)
    write(out, "batch-size-over-max", s.b)
    n += 1

    # Hostile tensors.
    for name, kw in [
        ("misaligned-q", dict(mode2=248)), ("misaligned-kv", dict(mode2=249)), ("misaligned-out", dict(mode2=250)),
        ("misaligned-lse", dict(mode2=251)), ("null-q", dict(mode3=244)), ("null-kv", dict(mode3=245)),
        ("null-out", dict(mode3=246)), ("nan-q-scale", dict(qs=248)), ("negative-kv-scale", dict(kvs=246)),
        ("extreme-scales", dict(qs=237, kvs=238)), ("short-cache", dict(pages=240)),
        ("negative-num-pages", dict(num_pages=251)), ("workspace-short", dict(ws=230)),
        ("workspace-exact", dict(ws=200)), ("workspace-misaligned", dict(ws=170)),
        ("bad-stride", dict(stride=("bad", 17))), ("stride-32", dict(stride=32)),
        ("tensors-struct-long-zero-tail", dict(tsize=239)), ("tensors-struct-nonzero-tail", dict(tsize=237)),
        ("tensors-struct-short", dict(tsize=241)), ("no-lse", dict(mode=2)),
    ]:
        s = prologue(0x6000)
        desc(s, heads=4, kv="mxfp4" if "stride" in name else "fp8", q="bf16", ps=16, mb=4, mq=2)
        no_metadata_execute(s)
        s.u8(0)
        batch(s, [(2, 2, 5), (1, 1, 16)], execs=2)
        execute(s, **kw)
        execute(s, mode=4)
        write(out, "tensors-%s" % name, s.b)
        n += 1
    # Out-of-range explicit page indices.
    for name, entry in [("minus1", 250), ("int-min", 251), ("int-max", 252), ("num-pages", 255)]:
        s = prologue(0x7000)
        desc(s, heads=2, kv="bf16", ps=16, mb=2)
        no_metadata_execute(s)
        s.u8(0)
        batch(s, [(1, 2, 5)])
        execute(s, pages=3, table=[0, entry])
        write(out, "page-out-of-range-%s" % name, s.b)
        n += 1
    # A caller workspace that is required but missing.
    s = prologue(0x7100)
    desc(s, heads=2, flags=4)
    no_metadata_execute(s)
    s.u8(0)
    batch(s, [(1, 1, 1)])
    execute(s, ws=250)
    write(out, "caller-workspace-missing", s.b)
    n += 1
    # Struct sizes of desc / batch / info.
    for name, at, val in [("desc-zero", "desc", 236 + 0), ("desc-short", "desc", 236 + 1),
                          ("desc-long", "desc", 236 + 3), ("batch-short", "batch", 236 + 6),
                          ("info-nonzero-tail", "info", 237)]:
        s = prologue(0x7200)
        desc(s, heads=2)
        if at == "desc":
            s.b[-1] = val
            s.u8(0, 0)
        no_metadata_execute(s)
        s.u8(0)
        batch(s, [(1, 1, 1)])
        if at == "batch":
            s.b[-3] = val
        if at == "info":
            s.b[-2] = val
            s.b[-1:-1] = bytes([5, 9])
        execute(s)
        write(out, "struct-size-%s" % name, s.b)
        n += 1
    print("make_corpus.py: wrote %d seeds to %s" % (n, out))


if __name__ == "__main__":
    main()
