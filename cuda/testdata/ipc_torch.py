"""Exporting side of TestIPCImportFromTorch: a PyTorch CUDA allocation.

Prints "HANDLE <hex> <offset> <size> <sha256>" (the storage's CUDA IPC
handle and the tensor's byte offset in the allocation behind it), then
answers one "VERIFY <sha256>" line with "OK" or "MISMATCH <sha256>".
"""

import hashlib
import sys

import torch


def digest(x):
    torch.cuda.synchronize()
    return hashlib.sha256(x.cpu().numpy().tobytes()).hexdigest()


def main():
    n = int(sys.argv[1])
    x = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    # (device, handle, storage bytes, storage offset bytes, ref counter
    # handle, ref counter offset, event handle, event sync required)
    share = x.untyped_storage()._share_cuda_()
    handle, offset = share[1], share[3]
    # PyTorch >= 2.5 prefixes the cudaIpcMemHandle_t with a format version
    # byte and a kind byte: 'c' for a cudaMalloc block (what CUDA IPC can
    # open), 'e' for an expandable segment (a file-descriptor handle).
    if len(handle) == 66:
        if handle[1:2] != b"c":
            sys.exit("not a cudaMalloc IPC handle: kind %r" % handle[1:2])
        handle = handle[2:]
    if len(handle) != 64:
        sys.exit("unexpected IPC handle of %d bytes" % len(handle))
    print("HANDLE", handle.hex(), offset, n, digest(x), flush=True)
    want = sys.stdin.readline().split()[1]
    got = digest(x)
    print("OK" if got == want else "MISMATCH " + got, flush=True)


if __name__ == "__main__":
    main()
