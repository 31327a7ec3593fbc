#!/usr/bin/env bash
# Development machine: packs vLLM 0.26.0 and the packages the GPU machine lacks
# (scripts/gpu/vllm-carry.txt) into .gpucarry/, in parts small enough for one
# device call each (scripts/gpu/vllm.sh carry1 / carry2 move them in).
#
# The wheels are unpacked into one site directory (a --target install, done by
# hand because this machine's Python is not 3.12), vLLM is slimmed of what an
# H200 running Qwen3-8B on FLASH_ATTN never loads — FlashAttention 2 (Hopper
# runs FA3), the MoE kernels, FlashMLA, DeepGEMM, the SM100 FMHA and the Rust
# frontend (each import of them is optional in vLLM) — and the rest is xz'ed
# and split: about 100 MB in two parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W/deps" .gpucarry
plat=(--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)
pipdl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" "$@"; }
pipdl -d "$W" vllm==0.26.0
grep -v '^#' scripts/gpu/vllm-carry.txt | pipdl -d "$W/deps" -r /dev/stdin
python3 - "$SITE" "$W" <<'PY'
import glob, os, shutil, sys, zipfile
site, w = sys.argv[1], sys.argv[2]
for whl in sorted(glob.glob(f"{w}/deps/*.whl")) + glob.glob(f"{w}/vllm-0.26.0-*.whl"):
    with zipfile.ZipFile(whl) as z:
        for n in z.namelist():
            parts = n.split("/")
            if parts[0].endswith(".data"):
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                parts = parts[2:]
            if n.endswith("/"):
                continue
            dst = os.path.join(site, *parts)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with z.open(n) as src, open(dst, "wb") as f:
                shutil.copyfileobj(src, f)
PY
v=$SITE/vllm
rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/_moe_C_stable_libtorch.abi3.so" "$v/vllm-rs" "$v/_flashmla_C.abi3.so"
rm -rf "$v/third_party/deep_gemm" "$v/third_party/fmha_sm100"
rm -f .gpucarry/vllm-site.*
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/vllm-site.tar.xz
(cd .gpucarry && sha256sum vllm-site.tar.xz >vllm-site.sha256 && split -b 60M -d vllm-site.tar.xz vllm-site.part && rm vllm-site.tar.xz)
ls -l .gpucarry
