"""The CUDA IPC description of KV tensors, checked on CPU with stand-ins for
CUDA tensors: real CPU tensors (so views, strides and data pointers are
real) that report device 'cuda' and answer _share_cuda_ like torch does."""

import types

import pytest
import torch

from orbitkv import buffers, errors

HANDLE = bytes(range(64))


class _Storage:
    def __init__(self, root, share):
        self._root, self._share = root, share

    def data_ptr(self):
        return self._root.data_ptr()

    def _share_cuda_(self):
        return self._share


class FakeCuda:
    """A CPU tensor posing as a CUDA tensor whose storage is ``root``."""

    device = types.SimpleNamespace(type="cuda", index=0)

    def __init__(self, t, root=None, share=None):
        self._t, self._root = t, root if root is not None else t
        nbytes = self._root.numel() * self._root.element_size()
        self._share = share or (0, b"\x01c" + HANDLE, nbytes, 4096, b"rc", 0, b"ev", True)

    def __getattr__(self, name):
        return getattr(self._t, name)

    def __getitem__(self, i):
        return FakeCuda(self._t[i], self._root, self._share)

    def unflatten(self, *a):
        return FakeCuda(self._t.unflatten(*a), self._root, self._share)

    def untyped_storage(self):
        return _Storage(self._root, self._share)


def test_handle_prefix_is_stripped_and_kinds_checked():
    assert buffers.ipc_handle_bytes(b"\x01c" + HANDLE) == HANDLE
    assert buffers.ipc_handle_bytes(HANDLE) == HANDLE
    with pytest.raises(errors.BufferError_, match="expandable"):
        buffers.ipc_handle_bytes(b"\x01e" + HANDLE)
    with pytest.raises(errors.BufferError_, match="10 bytes"):
        buffers.ipc_handle_bytes(bytes(10))


def test_flash_pool_is_one_buffer_with_storage_offsets():
    L, NB, BS, H, D = 3, 5, 4, 2, 8
    pool = torch.zeros(L, 2, NB, BS, H, D, dtype=torch.bfloat16)
    kv = {f"l{i}": FakeCuda(pool)[i] for i in range(L)}
    desc = buffers.describe_planes(buffers.vllm_planes(kv))
    assert desc.buffers == (buffers.CudaIpcBuffer(HANDLE, 0, 4096, pool.numel() * 2),)
    bb = BS * H * D * 2
    assert desc.dtype == "bf16" and desc.num_blocks == NB
    for s in desc.segments:
        assert s.buffer == 0 and s.block_bytes == bb and s.block_stride == bb
        assert s.offset == (s.layer * 2 + s.plane) * NB * bb
    proto = desc.buffers[0].to_proto()
    assert proto.cuda.handle == HANDLE and proto.cuda.offset == 4096 and proto.size_bytes == pool.numel() * 2


def test_flashinfer_planes_interleave():
    L, NB, BS, H, D = 2, 3, 4, 2, 8
    pool = torch.zeros(L, NB, 2, BS, H, D, dtype=torch.float16)
    desc = buffers.describe_planes(buffers.vllm_planes([FakeCuda(pool)[i] for i in range(L)]))
    bb = BS * H * D * 2
    assert desc.segments[1].offset - desc.segments[0].offset == bb
    assert desc.segments[0].block_stride == 2 * bb


def test_sglang_per_layer_buffers_in_separate_storages():
    L, tokens, H, D, page = 2, 32, 2, 4, 8
    ks = [FakeCuda(torch.zeros(tokens, H, D, dtype=torch.bfloat16), share=(0, HANDLE, tokens * H * D * 2, 1024 * i, 0, 0, 0, 0))
          for i in range(L)]
    vs = [FakeCuda(torch.zeros(tokens, H, D, dtype=torch.bfloat16), share=(0, HANDLE, tokens * H * D * 2, 1 << 20 + i, 0, 0, 0, 0))
          for i in range(L)]
    desc = buffers.describe_planes(buffers.sglang_planes(ks, vs, page))
    # Four storages in one cudaMalloc block: four buffers, one handle.
    assert len(desc.buffers) == 4 and {b.handle for b in desc.buffers} == {HANDLE}
    assert all(s.offset == 0 for s in desc.segments)
    assert desc.segments[0].block_bytes == page * H * D * 2


def test_view_at_storage_offset():
    pool = torch.zeros(1 + 2 * 3 * 4 * 8, dtype=torch.float32)
    t = pool[1:].view(2, 3, 4, 8)  # one element into the storage
    desc = buffers.describe_planes([[FakeCuda(t, root=pool)[0], FakeCuda(t, root=pool)[1]]])
    assert desc.segments[0].offset == 4 and desc.segments[1].offset == 4 + 3 * 4 * 8 * 4


def test_mixed_devices_rejected():
    a = torch.zeros(2, 3, 4, 8)
    cpu_plane = torch.zeros(3, 4, 8)
    with pytest.raises(errors.BufferError_, match="mix CPU and CUDA"):
        buffers.describe_planes([[FakeCuda(a)[0], cpu_plane]])
    other = FakeCuda(torch.zeros(3, 4, 8), share=(1, HANDLE, 384, 0, 0, 0, 0, 0))
    with pytest.raises(errors.BufferError_, match="span CUDA devices"):
        buffers.describe_planes([[FakeCuda(a)[0], other]])


def _need_cuda():
    if torch.cuda.is_available():
        return
    import os
    if "cuda" in os.environ.get("ORBITKV_REQUIRE", ""):
        pytest.fail("ORBITKV_REQUIRE=cuda but torch sees no CUDA device")
    pytest.skip("skipping: torch sees no CUDA device (this test runs on the GPU machine)")


def test_real_cuda_pool():
    """On a GPU: a real vLLM-layout pool gives one 64-byte handle and the
    storage-relative offsets of every plane."""
    _need_cuda()
    torch.empty(3 << 20, dtype=torch.uint8, device="cuda")  # the pool need not start its block
    pool = torch.empty(2, 2, 8, 16, 2, 64, dtype=torch.bfloat16, device="cuda")
    view = pool[:, :, 1:]  # a view past the storage start
    desc = buffers.describe_planes(buffers.vllm_planes([view[i] for i in range(2)]))
    (b,) = desc.buffers
    st = pool.untyped_storage()
    assert len(b.handle) == 64 and b.device == pool.device.index and b.size_bytes == st.nbytes()
    bb = 16 * 2 * 64 * 2
    assert desc.segments[0].offset == view.data_ptr() - st.data_ptr() == bb
    assert desc.segments[1].offset == 8 * bb + bb
