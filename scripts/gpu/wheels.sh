# Sourced by the bundle scripts (vllm-bundle.sh, sglang-bundle.sh) on the development machine:
#   pipdl ARGS...            pip download of binary wheels for the GPU machine's CPython 3.12 on x86-64
#   unwheel SITE PATTERN...  unpack the wheels each glob PATTERN names (sorted within a pattern,
#                            patterns in order: a later wheel's file replaces an earlier one's) into
#                            SITE, as a --target install would lay them out (.data's purelib and
#                            platlib included, its scripts and headers left out; executable bits
#                            kept); done by hand
#                            because this machine's Python is not 3.12
GPU_PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
	--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)

pipdl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${GPU_PLATFORMS[@]}" "$@"; }

unwheel() {
	python3 - "$@" <<'PY'
import glob, os, shutil, sys, zipfile
site, patterns = sys.argv[1], sys.argv[2:]
for whl in [w for p in patterns for w in sorted(glob.glob(p))]:
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
            if (z.getinfo(n).external_attr >> 16) & 0o111:  # triton's ptxas, cuobjdump, nvdisasm
                os.chmod(dst, 0o755)
PY
}
