# PyTorch's TCPStore client against a tensorplay TcpStoreServer: every operation the client has.
# usage: torch_client.py HOST PORT ; prints "OK" and exits 0 when every check passed.
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    s = dist.TCPStore(host, port, 2, False, timedelta(seconds=10))  # counts itself in "init/"
    # values the C++ side prepared
    assert s.get("from_cpp") == b"hello", s.get("from_cpp")
    assert s.add("cpp_counter", 0) == 7
    s.set("a", "bc")
    assert s.get("a") == b"bc"
    assert s.add("n", 5) == 5
    assert s.add("n", -2) == 3
    assert s.get("n") == b"3"
    assert s.compare_set("a", "bc", "de") == b"de"
    assert s.compare_set("a", "zz", "qq") == b"de"
    assert s.compare_set("absent", "", "n1") == b"n1"
    assert s.compare_set("absent2", "xx", "yy") == b"xx"
    s.wait(["a", "n"])
    s.wait(["a"], timedelta(seconds=1))
    try:
        s.wait(["never"], timedelta(milliseconds=300))
        raise AssertionError("wait on a missing key did not time out")
    except RuntimeError:
        pass
    # a blocking get is woken by another client's set (another connection)
    other = dist.TCPStore(host, port, None, False, timedelta(seconds=10))
    t = threading.Timer(0.2, lambda: other.set("late", "L"))
    t.start()
    start = time.time()
    assert s.get("late") == b"L"
    assert time.time() - start < 5
    t.join()
    assert s.delete_key("a") is True
    assert s.delete_key("a") is False
    n = s.num_keys()
    assert n >= 6, n
    s.set("from_py", b"\x00\xffbinary")
    prefixed = dist.PrefixStore("rpc_prefix_0", s)
    prefixed.set("names/1", "w1")
    s.set("py_done", "1")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
