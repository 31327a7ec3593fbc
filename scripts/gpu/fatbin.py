#!/usr/bin/env python3
"""Lists, or blanks, the device code a shared object carries per GPU architecture.

  fatbin.py list SO            one line per (kind, arch): entries and bytes in .nv_fatbin
  fatbin.py keep SO ARCH...    blanks, in place, every ELF (cubin) entry whose arch is not listed;
                               sizes and offsets stay as they were, so the file's layout and every
                               kept entry are byte-identical
  fatbin.py keepz SO ARCH...   the same, and zeroes the payload of every compressed cubin entry whose
                               arch is not listed too (its entry header stays; tools can no longer
                               decompress it). torch's and the CUDA libraries' cubins are all
                               compressed (nvcc -Xfatbin -compress-all), so keep alone blanks nothing
                               there; the driver decompresses only the entry it picks for the device

Blanking keeps each passed-over cubin's ELF header, program and section header tables and
section names; the section contents, the code, become zeros. Tools that check every entry do not
accept that: cuobjdump 13.5 (PyPI nvidia-cuda-cuobjdump) stops at the first blanked or zeroed
entry with "Invalid ELF", for keep (sgl_kernel's flash_ops, libcurand) and keepz alike. The CUDA
driver does not check them: at module load it takes the cubin built for the device's own arch
(sm_90 on an H100 or H200) and reads no other; the keep-blanked flash_ops ran SGLang on both
cards (2026-12-02, 2026-12-05). keepz on a driver: unverified until vllm.sh's 0.33 kernel check. Zeroed contents cost nothing after xz. keep leaves compressed entries as they are. PTX entries are never touched
(a kept PTX lets the driver JIT for an arch with no cubin). Used by sglang-bundle.sh on
sgl_kernel's FA3 library, whose sm_80 and sm_86 cubins are half of its 1.1 GB.
keepz: by vllm033-bundle.sh on torch, the CUDA libraries and vLLM's _C (about 0.7 GiB of compressed
cubins for other GPUs).

Layout (NVIDIA's fatbinary, as cuobjdump reads it): the section holds containers, each a
16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64 payload size) followed by
entries: u16 kind (1 PTX, 2 ELF), u16, u32 header size, u64 payload size, ..., u32 arch at 28.
"""
import collections
import struct
import sys

MAGIC = 0xBA55ED50
KIND = {1: "ptx", 2: "elf"}


def section(f, name):
    f.seek(0)
    head = f.read(64)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        raise SystemExit("not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)

    def hdr(i):
        return struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize)

    s = hdr(shstrndx)
    f.seek(s[4])
    names = f.read(s[5])
    for i in range(shnum):
        h = hdr(i)
        if names[h[0]:names.index(b"\0", h[0])].decode() == name:
            return h[4], h[5]
    raise SystemExit(f"no {name} section")


def entries(f):
    """Yields (file offset of the payload, payload size, kind, arch) for every entry."""
    off, size = section(f, ".nv_fatbin")
    f.seek(off)
    blob = f.read(size)
    p = 0
    while p + 16 <= len(blob):
        magic, _, hsize, fsize = struct.unpack_from("<IHHQ", blob, p)
        if magic != MAGIC:  # containers are 8-byte aligned; padding between them
            p += 8
            continue
        q, end = p + hsize, p + hsize + fsize
        while q < end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", blob, q)
            arch, = struct.unpack_from("<I", blob, q + 28)
            yield off + q + ehsize, psize, kind, arch
            q += ehsize + psize
        p = end


def summary(path):
    agg = collections.defaultdict(lambda: [0, 0])
    with open(path, "rb") as f:
        for _, psize, kind, arch in entries(f):
            a = agg[(KIND.get(kind, kind), arch)]
            a[0] += 1
            a[1] += psize
    for (kind, arch), (n, b) in sorted(agg.items()):
        print(f"{path}: {kind} sm_{arch}: {n} entries, {b / 2**20:.1f} MiB")


def skeleton(cubin):
    """The byte ranges of an uncompressed cubin that describe it: the ELF header, program and
    section header tables and the section names. Everything else is section contents."""
    if cubin[:4] != b"\x7fELF":
        return None  # compressed entry: left as it is
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", cubin, 0x36)
    keep = [(0, 64), (phoff, phoff + phentsize * phnum), (shoff, shoff + shentsize * shnum)]
    if shstrndx < shnum:
        o, n = struct.unpack_from("<QQ", cubin, shoff + shstrndx * shentsize + 0x18)
        keep.append((o, o + n))
    return keep


def blanked(cubin):
    """The cubin with its section contents zeroed and its headers kept."""
    keep = skeleton(cubin)
    if keep is None:
        return None
    out = bytearray(len(cubin))
    for a, b in keep:
        out[a:b] = cubin[a:b]
    return bytes(out)


def keep(path, archs, compressed=False):
    with open(path, "r+b") as f:
        blank = [(o, s) for o, s, kind, arch in entries(f) if kind == 2 and arch not in archs]
        done, dz = [], []
        for o, s in blank:
            f.seek(o)
            c = f.read(s)
            b = blanked(c)
            if b is None and compressed:
                b = bytes(len(c))
                dz.append(s)
            if b is not None:
                f.seek(o)
                f.write(b)
                done.append(s)
        blank = [(0, s) for s in done]
    print(f"{path}: zeroed {len(blank)} cubins ({sum(s for _, s in blank) / 2**20:.1f} MiB"
          f"{f', {len(dz)} of them compressed, {sum(dz) / 2**20:.1f} MiB' if compressed else ''}) not for sm_{'/'.join(map(str, sorted(archs)))}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "list":
        summary(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] in ("keep", "keepz"):
        keep(sys.argv[2], {int(a) for a in sys.argv[3:]}, compressed=sys.argv[1] == "keepz")
        summary(sys.argv[2])
    else:
        raise SystemExit(__doc__)
