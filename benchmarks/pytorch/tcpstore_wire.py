"""Records the bytes PyTorch's TCPStore client and server exchange, through
a relay between them, for each store operation leangrad's client uses, and
prints the installed PyTorch's store enums and torchrun's key prefix: what
dist's Go client of the protocol is checked against.

    python3 benchmarks/pytorch/tcpstore_wire.py
"""
import os
import re
import socket
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

root = os.path.dirname(torch.__file__)
hdr = os.path.join(root, "include/torch/csrc/distributed/c10d")
print("torch", torch.__version__)
for name in ["TCPStoreBackend.hpp", "TCPStore.hpp"]:
    p = os.path.join(hdr, name)
    if not os.path.exists(p):
        print("no", p)
        continue
    text = open(p).read()
    for m in re.finditer(r"(enum class \w+[^{]*\{[^}]*\}|static const \w+ \w*[Mm]agic\w* = [^;]*;|\w*[Mm]agic\w*\s*=\s*[^;]*;)", text):
        print(name, ":", " ".join(m.group(0).split()))
rv = os.path.join(root, "distributed/rendezvous.py")
for i, line in enumerate(open(rv)):
    if "attempt" in line or "PrefixStore" in line or "TORCHELASTIC_USE_AGENT_STORE" in line:
        print("rendezvous.py:%d: %s" % (i + 1, line.rstrip()))

log = []
lock = threading.Lock()


def pump(src, dst, tag):
    while True:
        try:
            b = src.recv(65536)
        except OSError:
            return
        if not b:
            return
        with lock:
            log.append((tag, b))
        dst.sendall(b)


server = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10), wait_for_workers=False)
relay = socket.socket()
relay.bind(("127.0.0.1", 0))
relay.listen(4)


def accept():
    while True:
        c, _ = relay.accept()
        s = socket.create_connection(("127.0.0.1", server.port))
        threading.Thread(target=pump, args=(c, s, "C>S"), daemon=True).start()
        threading.Thread(target=pump, args=(s, c, "S>C"), daemon=True).start()


threading.Thread(target=accept, daemon=True).start()


def step(name, f):
    time.sleep(0.2)
    with lock:
        log.clear()
    try:
        r = f()
    except Exception as e:  # noqa: BLE001
        r = "error: %s" % e
    time.sleep(0.2)
    with lock:
        print("%-12s -> %r" % (name, r))
        for tag, b in log:
            print("   ", tag, b.hex())


client = None


def connect():
    global client
    client = dist.TCPStore("127.0.0.1", relay.getsockname()[1], 1, False, timedelta(seconds=5), wait_for_workers=False)
    return "connected"


step("connect", connect)
step("set", lambda: client.set("key", b"val"))
step("get", lambda: client.get("key"))
step("add", lambda: client.add("cnt", 5))
step("add again", lambda: client.add("cnt", -2))
step("check", lambda: client.check(["key", "nokey"]))
step("wait", lambda: client.wait(["key"]))
step("wait miss", lambda: client.wait(["late"], timedelta(milliseconds=300)))
step("compare_set", lambda: client.compare_set("key", b"val", b"new"))
step("num_keys", lambda: client.num_keys())
step("delete_key", lambda: client.delete_key("cnt"))
