# PyTorch's TCPStore server for a tensorplay TcpStore client (torch113 dialect).
# Prints "PORT <n>", then waits for the key "cpp_done" and checks what the C++ client stored.
import sys
from datetime import timedelta

import torch.distributed as dist


def main():
    s = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    s.set("from_py", "hi")
    print("PORT", s.port, flush=True)
    s.wait(["cpp_done"], timedelta(seconds=30))
    assert s.get("cpp_set") == b"v1", s.get("cpp_set")
    assert s.get("cpp_counter") == b"10", s.get("cpp_counter")
    assert s.get("cpp_appended") == b"abcd", s.get("cpp_appended")
    assert s.get("cpp_multi2") == b"m2"
    print("VERIFIED", flush=True)


if __name__ == "__main__":
    main()
