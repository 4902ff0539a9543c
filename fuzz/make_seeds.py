#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (real requests and the hostile shapes of
issue 6). Rerun after editing; files are overwritten, never deleted."""
import os, struct

HERE = os.path.dirname(os.path.abspath(__file__))

def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("latin-1")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

H = "Host: cdn.example\r\n"
requests = {
    "get-simple": "GET / HTTP/1.1\r\n" + H + "\r\n",
    "get-curl": "GET /pkg/update-1.2.3.pak HTTP/1.1\r\n" + H + "User-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
    "get-range": "GET /big.bin HTTP/1.1\r\n" + H + "Range: bytes=0-1048575\r\n\r\n",
    "get-multirange": "GET /big.bin HTTP/1.1\r\n" + H + "Range: bytes=0-9,20-29,-5\r\n\r\n",
    "get-conditional": "GET /m.json HTTP/1.1\r\n" + H + "If-None-Match: \"1-2-3\", W/\"x\"\r\nIf-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\nIf-Range: \"1-2-3\"\r\nRange: bytes=5-\r\n\r\n",
    "head": "HEAD /x HTTP/1.1\r\n" + H + "\r\n",
    "http10": "GET / HTTP/1.0\r\n\r\n",
    "http10-keepalive": "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    "absolute-form": "GET http://cdn.example/a?b#c HTTP/1.1\r\n" + H + "\r\n",
    "pipelined": ("GET /a HTTP/1.1\r\n" + H + "\r\n") * 3,
    "leading-crlf": "\r\n\r\nGET / HTTP/1.1\r\n" + H + "\r\n",
    "steam-like": "GET /depot/123/chunk/abcdef HTTP/1.1\r\nHost: cache1.example\r\nAccept: text/html,*/*;q=0.9\r\nAccept-Encoding: gzip,identity,*;q=0\r\nAccept-Charset: ISO-8859-1,utf-8,*;q=0.7\r\nUser-Agent: Valve/Steam HTTP Client 1.0\r\n\r\n",
    # traversal in the target
    "trav-dotdot": "GET /../etc/passwd HTTP/1.1\r\n" + H + "\r\n",
    "trav-pct": "GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\n" + H + "\r\n",
    "trav-backslash": "GET /..\\..\\etc\\passwd HTTP/1.1\r\n" + H + "\r\n",
    "trav-overlong": "GET /%c0%ae%c0%ae%c0%afetc HTTP/1.1\r\n" + H + "\r\n",
    "nul-raw-target": "GET /a\x00b HTTP/1.1\r\n" + H + "\r\n",
    # smuggling shapes
    "cl-te": "GET / HTTP/1.1\r\n" + H + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "te-only": "GET / HTTP/1.1\r\n" + H + "Transfer-Encoding: chunked\r\n\r\n",
    "cl-dup": "GET / HTTP/1.1\r\n" + H + "Content-Length: 0\r\nContent-Length: 0\r\n\r\n",
    "cl-plus": "GET / HTTP/1.1\r\n" + H + "Content-Length: +5\r\n\r\n",
    "cl-hex": "GET / HTTP/1.1\r\n" + H + "Content-Length: 0x10\r\n\r\n",
    "cl-neg": "GET / HTTP/1.1\r\n" + H + "Content-Length: -1\r\n\r\n",
    "cl-20digits": "GET / HTTP/1.1\r\n" + H + "Content-Length: 18446744073709551616\r\n\r\n",
    "cl-list": "GET / HTTP/1.1\r\n" + H + "Content-Length: 0, 0\r\n\r\n",
    "obs-fold": "GET / HTTP/1.1\r\n" + H + "X-A: b\r\n c\r\n\r\n",
    "bare-cr": "GET / HTTP/1.1\r\n" + H + "X-A: b\rc\r\n\r\n",
    "bare-lf": "GET / HTTP/1.1\n" + H + "\r\n",
    "bare-lf-field": "GET / HTTP/1.1\r\n" + H + "X-A: b\n\r\n",
    "nul-value": "GET / HTTP/1.1\r\n" + H + "X-A: b\x00c\r\n\r\n",
    "space-before-colon": "GET / HTTP/1.1\r\n" + H + "Content-Length : 5\r\n\r\n",
    "host-dup": "GET / HTTP/1.1\r\n" + H + H + "\r\n",
    "host-missing": "GET / HTTP/1.1\r\n\r\n",
    # methods and versions
    "post": "POST / HTTP/1.1\r\n" + H + "Content-Length: 3\r\n\r\nabc",
    "unknown-method": "BREW /pot HTTP/1.1\r\n" + H + "\r\n",
    "http09": "GET /\r\n",
    "h2-preface": "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "http20-line": "GET / HTTP/2.0\r\n" + H + "\r\n",
    "http12": "GET / HTTP/1.2\r\n" + H + "\r\n",
    "lowercase-version": "GET / http/1.1\r\n" + H + "\r\n",
    "tls-hello": "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + "\x00" * 32,
    # limits
    "long-line": "GET /" + "a" * 8300 + " HTTP/1.1\r\n" + H + "\r\n",
    "long-head": "GET / HTTP/1.1\r\n" + H + "X-Big: " + "b" * 17000 + "\r\n\r\n",
    "many-headers": "GET / HTTP/1.1\r\n" + H + "".join("X-%d: v\r\n" % i for i in range(70)) + "\r\n",
    "many-empty-lines": "\r\n" * 6 + "GET / HTTP/1.1\r\n" + H + "\r\n",
}
for name, data in requests.items():
    write("request_parser", name, data)

def rng(name, length, max_ranges, header):
    write("range_parser", name, struct.pack("<QB", length, max_ranges) + header.encode("latin-1"))

M = 2**64 - 1
ranges = [
    ("single", 1000, 16, "bytes=0-499"),
    ("open", 1000, 16, "bytes=500-"),
    ("suffix", 1000, 16, "bytes=-500"),
    ("multi", 10000, 16, "bytes=0-9,20-29,100-199"),
    ("overlap", 10000, 16, "bytes=0-99,50-149,140-300"),
    ("adjacent", 10000, 16, "bytes=0-9,10-19"),
    ("too-many", 10000, 4, "bytes=" + ",".join("%d-%d" % (i * 10, i * 10 + 1) for i in range(20))),
    ("apache-dos", 10000, 16, "bytes=0-," + ",".join("5-%d" % i for i in range(40))),
    ("overflow-last", 1000, 16, "bytes=0-18446744073709551615"),
    ("overflow-first", 1000, 16, "bytes=18446744073709551615-"),
    ("overflow-suffix", 1000, 16, "bytes=-18446744073709551616"),
    ("huge-file", M, 16, "bytes=18446744073709551614-"),
    ("reverse", 1000, 16, "bytes=9-1"),
    ("unit", 1000, 16, "items=0-1"),
    ("spaces", 1000, 16, "  bytes= 0 - 1 , 5-6 "),
    ("empty-elements", 1000, 16, "bytes=,,0-1,,"),
    ("zero-file", 0, 16, "bytes=0-0"),
    ("zero-max", 1000, 0, "bytes=0-1"),
    ("sum-over-file", 100, 16, "bytes=0-99,0-99"),
    ("garbage", 1000, 16, "bytes=a-b,--,-,1-2-3"),
]
for name, length, mx, header in ranges:
    rng(name, length, mx, header)

paths = {
    "root": "/",
    "file": "/pkg/update-1.2.3.pak",
    "dir": "/pkg/",
    "dotdot": "/../canary",
    "dotdot-deep": "/a/b/../../../canary",
    "inside-dotdot": "/a/../b",
    "pct-dotdot": "/%2e%2e/canary",
    "pct-mixed": "/.%2e/canary",
    "pct-upper": "/%2E%2E/canary",
    "double-encoded": "/%252e%252e/canary",
    "nested-pct": "/%%32%65%%32%65/canary",
    "backslash": "/..\\canary",
    "pct-backslash": "/..%5ccanary",
    "pct-slash": "/..%2fcanary",
    "overlong-slash": "/%c0%af..%c0%afcanary",
    "overlong-dot": "/%c0%ae%c0%ae/canary",
    "nul-pct": "/a%00.txt",
    "nul-raw": "/a\x00.txt",
    "control": "/a%0d%0aSet-Cookie:x",
    "utf8": "/caf%C3%A9",
    "dot-names": "/.well-known/.../x",
    "truncated-escape": "/a%2",
    "long-segment": "/" + "a" * 300,
    "many-segments": "/a" * 3000,
}
for name, data in paths.items():
    write("path_resolver", name, data)

origin = {
    "206": "HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\nContent-Range: bytes 0-9/100\r\nETag: \"v1\"\r\n\r\n0123456789",
    "200": "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nLast-Modified: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Type: application/octet-stream\r\n\r\nhello",
    "304": "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\n\r\n",
    "http10-bare-lf": "HTTP/1.0 200 OK\nContent-Length: 0\n\n",
    "chunked": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "two-lengths": "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
    "bad-range": "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 9-0/x\r\n\r\n",
    "star-total": "HTTP/1.1 206 Partial Content\r\nContent-Length: 1\r\nContent-Range: bytes 0-0/*\r\n\r\n",
    "connection-close": "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nConnection: close\r\n\r\n",
    "truncated": "HTTP/1.1 200 OK\r\nContent-Len",
    "garbage": "\x00\xffHTTP/1.1 200\r\n\r\n",
    "many-fields": "HTTP/1.1 200 OK\r\n" + "X: y\r\n" * 70 + "\r\n",
    # Issue 45's hostile replies.
    "trailing-reply": "HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\nContent-Range: bytes 0-2/3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 16\r\nETag: \"evil\"\r\n\r\nPOISONPOISONPOIS",
    "te-identity-length": "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc",
    "two-te-length": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\nContent-Length: 8\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "two-ranges": "HTTP/1.1 206 Partial Content\r\nContent-Length: 2\r\nContent-Range: bytes 0-1/4\r\nContent-Range: bytes 2-3/4\r\n\r\nab",
    "plus-length": "HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\nabc",
    "interim": "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
}
for name, data in origin.items():
    write("origin_response", name, data)

def v2(cmd_fam, addr):
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x20 | 1, cmd_fam]) + struct.pack(">H", len(addr)) + addr
proxy = {
    "v1-tcp4": b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n\r\n",
    "v1-tcp6": b"PROXY TCP6 2001:db8::1 2001:db8::2 56324 443\r\n",
    "v1-unknown": b"PROXY UNKNOWN\r\n",
    "v1-no-crlf": b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443" + b" " * 80,
    "v1-bad-port": b"PROXY TCP4 192.0.2.1 198.51.100.2 99999 443\r\n",
    "v2-tcp4": v2(0x11, bytes([192, 0, 2, 1, 198, 51, 100, 2]) + struct.pack(">HH", 56324, 443)),
    "v2-tcp6": v2(0x21, bytes(15) + b"\x01" + bytes(15) + b"\x02" + struct.pack(">HH", 1, 2)),
    "v2-local": b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x20, 0x00, 0, 0]),
    "v2-short-addr": v2(0x11, bytes([192, 0, 2])),
    "v2-tlv": v2(0x11, bytes([192, 0, 2, 1, 198, 51, 100, 2]) + struct.pack(">HH", 1, 2) + b"\x04\x00\x02ab"),
    "v2-signature-only": b"\r\n\r\n\x00\r\nQUIT\n",
    "not-proxy": b"GET / HTTP/1.1\r\n\r\n",
}
for name, data in proxy.items():
    write("proxy_header", name, data)

import zlib
def crc32c(data):
    # CRC-32C (Castagnoli), reflected, as cache::checksum.
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
def frame(body):
    return struct.pack("<II", len(body), crc32c(body)) + body
def text(s):
    return struct.pack("<H", len(s)) + s
obj = b"\x01" + text(b"\x00\x01/depot/1/chunk/abc") + struct.pack("<QQIQ", 7, 3 << 20, 1 << 20, 1764633600) + text(b'"v1"') + text(b"") + text(b"application/octet-stream")
block = b"\x02" + struct.pack("<QII", 7, 0, 0xDEADBEEF)
journal = {
    "object-and-block": frame(obj) + frame(block),
    "drop": frame(b"\x03" + struct.pack("<Q", 7)),
    "fresh": frame(b"\x04" + struct.pack("<QQ", 7, 1764640000)),
    "torn-tail": frame(obj) + frame(block)[:9],
    "bad-crc": frame(obj)[:-1] + b"\x00",
    "unknown-kind": frame(b"\x09abc"),
    "trailing-field": frame(b"\x03" + struct.pack("<Q", 7) + b"x"),
    "zero-length": struct.pack("<II", 0, 0),
    "huge-length": struct.pack("<II", 0xFFFFFFFF, 0) + b"x" * 16,
}
for name, data in journal.items():
    write("journal_record", name, data)
