import os
import types

import pytest
import torch

from orbitkv import buffers, errors
from tests.shm import flash_layers, pool_bytes, shm_pool


def _read(path, off, n):
    with open(path, "rb") as f:
        f.seek(off)
        return f.read(n)


def _check_segments(path, desc, planes):
    for seg in desc.segments:
        t = planes[seg.layer][seg.plane]
        for b in (0, desc.num_blocks - 1):
            want = t[b].contiguous().flatten().view(torch.uint8).numpy().tobytes()
            assert _read(path, seg.offset + b * seg.block_stride, seg.block_bytes) == want


def test_flash_layout_resolves_file_and_offsets():
    L, NB, BS, H, D = 3, 5, 4, 2, 8
    with shm_pool(pool_bytes(L, NB, BS, H, D) + 4096) as (path, pool):
        pool.copy_(torch.randint(0, 255, pool.shape, dtype=torch.uint8))
        kv = flash_layers(pool[4096:], L, NB, BS, H, D)  # a view at a file offset
        planes = buffers.vllm_planes(kv)
        desc = buffers.describe_planes(planes)
        assert [b.path for b in desc.buffers] == [path]
        assert desc.num_blocks == NB and desc.dtype == "fp32" and len(desc.segments) == 2 * L
        assert desc.segments[0].offset == 4096
        assert desc.segments[0].block_bytes == BS * H * D * 4
        _check_segments(path, desc, planes)


def test_flashinfer_layout():
    L, NB, BS, H, D = 2, 3, 4, 2, 8
    with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
        pool.copy_(torch.randint(0, 255, pool.shape, dtype=torch.uint8))
        t = pool.view(torch.float32).view(L, NB, 2, BS, H, D)
        kv = {f"l{i}": t[i] for i in range(L)}
        assert buffers.vllm_layout_of(t[0]) == "flashinfer"
        planes = buffers.vllm_planes(kv)
        desc = buffers.describe_planes(planes)
        assert desc.segments[1].offset - desc.segments[0].offset == BS * H * D * 4
        assert desc.segments[0].block_stride == 2 * BS * H * D * 4
        _check_segments(path, desc, planes)


def test_sglang_token_buffers():
    L, tokens, H, D, page = 2, 32, 2, 4, 8
    with shm_pool(2 * L * tokens * H * D * 2) as (path, pool):
        pool.copy_(torch.randint(0, 255, pool.shape, dtype=torch.uint8))
        t = pool.view(torch.bfloat16).view(2, L, tokens, H, D)
        planes = buffers.sglang_planes(list(t[0]), list(t[1]), page)
        desc = buffers.describe_planes(planes)
        assert desc.num_blocks == tokens // page and desc.dtype == "bf16"
        assert desc.segments[0].block_bytes == page * H * D * 2
        _check_segments(path, desc, planes)


def test_hnd_order_is_reported():
    with shm_pool(2 * 4 * 4 * 2 * 8 * 4) as (path, pool):
        t = pool.view(torch.float32).view(2, 4, 2, 4, 8).permute(0, 1, 3, 2, 4)  # heads before tokens
        desc = buffers.describe_planes([[t[0], t[1]]])
        nhd = buffers.describe_planes([[x.permute(0, 2, 1, 3) for x in (t[0], t[1])]])
        assert desc.inner_order != nhd.inner_order


def test_anonymous_memory_is_not_file_backed():
    t = torch.zeros(4, 2, 2, 8)
    with pytest.raises(errors.NotFileBacked):
        buffers.describe_planes([[t, t]])


def test_private_mapping_rejected():
    import os
    import tempfile

    fd, path = tempfile.mkstemp(dir="/dev/shm")
    os.ftruncate(fd, 1024)
    os.close(fd)
    try:
        t = torch.from_file(path, shared=False, size=1024, dtype=torch.uint8)
        with pytest.raises(errors.NotFileBacked, match="private"):
            buffers.resolve_file_range(t.data_ptr(), 1024)
    finally:
        os.unlink(path)


def test_non_dense_block_rejected():
    with shm_pool(4096) as (_, pool):
        t = pool.view(torch.float32).view(4, 16, 16)[:, :, :8]
        with pytest.raises(errors.BufferError_, match="dense"):
            buffers.describe_planes([[t, t]])


def test_unknown_device_rejected():
    fake = types.SimpleNamespace(device=types.SimpleNamespace(type="xpu"))
    with pytest.raises(errors.BufferError_, match="unsupported KV device"):
        buffers._check_cpu(fake)


def test_ambiguous_vllm_shape():
    with pytest.raises(errors.BufferError_, match="ambiguous"):
        buffers.vllm_layout_of(torch.zeros(2, 2, 4, 1, 1))


def test_share_cpu_tensors_moves_anonymous_kv_into_shm_in_place():
    import numpy as np

    base = torch.zeros(4 * 2 * 8 * 16, dtype=torch.float32)  # anonymous, like vLLM's CPU KV cache
    packed = base.view(4, 2, 8, 16)  # (blocks, heads, tokens, 2*dim)
    logical = packed.permute(0, 2, 1, 3)  # another view of the same storage
    packed[1, 0, 0, 0] = 7.0
    with pytest.raises(buffers.NotFileBacked):
        buffers.resolve_file_range(packed.data_ptr(), 4)
    made = buffers.share_cpu_tensors([packed, logical])
    try:
        assert len(made) == 1  # one storage, one file
        assert made[0].size_bytes == base.numel() * 4
        assert buffers.resolve_file_range(packed.data_ptr(), 4) == (made[0].path, 0)
        assert (logical.shape, logical.stride()) == ((4, 8, 2, 16), (256, 16, 128, 1))
        assert packed[1, 0, 0, 0].item() == 7.0 and logical[1, 0, 0, 0].item() == 7.0  # contents kept
        logical[2, 3, 1, 4] = 5.0  # a write through one view lands in the file
        raw = np.fromfile(made[0].path, dtype=np.float32)  # read as the peer opens it
        assert raw[2 * 256 + 1 * 128 + 3 * 16 + 4] == 5.0 and packed[2, 1, 3, 4].item() == 5.0
        assert buffers.share_cpu_tensors([packed, logical]) == []  # already shareable: left alone
    finally:
        for f in made:
            f.close()
    assert not os.path.exists(made[0].path)  # the session's end removes it


def test_a_kv_cache_that_does_not_fit_dev_shm_fails_clearly_and_leaves_nothing(monkeypatch):
    """No room for the KV cache in /dev/shm: a clear BufferError_ at
    registration (a sparse file would have let the copy die of SIGBUS),
    no file left behind, the tensor still usable where it was."""
    import errno

    def full(fd, off, n):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    before = set(os.listdir(buffers.shared_dir()))
    kv = torch.ones(4096)
    ptr = kv.data_ptr()
    with pytest.raises(errors.BufferError_, match="cannot hold the 16384-byte KV cache"):
        buffers.share_cpu_tensors([kv])
    assert set(os.listdir(buffers.shared_dir())) == before
    assert kv.data_ptr() == ptr and kv.sum().item() == 4096


_KILLED_ENGINE = """
import os, signal, sys, torch
sys.path.insert(0, sys.argv[1])
from orbitkv import buffers
kv = torch.ones(1 << 20, dtype=torch.float32)  # 4 MiB of anonymous "KV cache"
made = buffers.share_cpu_tensors([kv])
print(getattr(made[0], "path", made[0]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no session end, no cleanup
"""


def test_a_killed_engines_shared_kv_is_removed_by_the_next_engine():
    """A killed engine leaves its /dev/shm KV file (its whole KV cache of RAM);
    the next engine to share its KV removes it once it is older than
    ORPHAN_AGE_S — and never a living engine's, nor one just made."""
    import subprocess
    import sys
    import time

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(buffers.__file__)))
    p = subprocess.run([sys.executable, "-c", _KILLED_ENGINE, pkg], capture_output=True, text=True, timeout=60)
    assert p.returncode == -9, p.stderr
    orphan = p.stdout.strip()
    assert orphan.startswith("/dev/shm/" + buffers.KV_PREFIX) and os.path.exists(orphan), orphan  # a path any peer can open
    living = buffers.share_cpu_tensors([torch.zeros(1024)])  # this process's, locked
    try:
        assert os.path.exists(orphan)  # too young to be taken for an orphan
        old = time.time() - 2 * buffers.ORPHAN_AGE_S
        for path in (orphan, living[0].path):
            os.utime(path, (old, old))
        again = buffers.share_cpu_tensors([torch.zeros(1024)])  # the next engine's start
        try:
            assert not os.path.exists(orphan), "a killed engine's KV file was left in /dev/shm"
            assert os.path.exists(living[0].path), "a living engine's KV file was removed"
        finally:
            for f in again:
                f.close()
    finally:
        for f in living:
            f.close()
        if os.path.exists(orphan):
            os.unlink(orphan)
