#!/usr/bin/env python3
"""Which modules SGLang's server imports that are not installed: the way sglang-carry.txt was found.

  FORCE=pynvml,soundfile python scripts/gpu/sglang-imports.py [MODULE...]

Imports the modules `python -m sglang.launch_server` loads for Qwen3 with --attention-backend fa3
and HiCache with a dynamic storage backend (default list below), on a CPU with torch's CUDA
queries answering as an H200 (capability 9.0), so that the `if _is_cuda:` imports are taken as on
the GPU machine. sgl_kernel (whose libraries need CUDA 13) and the modules named in FORCE are
stubbed; any other missing module stops the run and is printed with the import chain that needs
it. Repeat, adding each name to FORCE once its package is in sglang-carry.txt or known to be on
the GPU machine, until no module is missing; then compare the printed list of installed packages
the import used with the GPU image's list and vllm-carry.txt. Imports inside functions are not
followed (the server's start-up paths were read by hand: see sglang-carry.txt).
Run it with the SGLang test environment (scripts/install-sglang.sh, or install-sglang0523.sh for
sglang0523-carry.txt) plus any wheels being tried on PYTHONPATH.
"""

import importlib, importlib.abc, importlib.machinery, sys, types, os, collections
from unittest import mock
STUBBED = collections.OrderedDict()
PROVIDED = {"sgl_kernel"}  # carried by the bundle; its .so needs CUDA 13, so stub it here
FORCE = set(os.environ.get("FORCE", "").split(",")) - {""}  # on the GPU machine or in the bundle
class Stub(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__") and n not in ("__version__",):
            raise AttributeError(n)
        return mock.MagicMock(name=f"{self.__name__}.{n}")
class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top in PROVIDED or top in FORCE:
            STUBBED.setdefault(top, set()).add(_caller())
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def _missing(self, name):
        for f in sys.meta_path:
            if f is self: continue
            try:
                if f.find_spec(name, None) is not None: return False
            except Exception: pass
        return True
    def create_module(self, spec):
        m = Stub(spec.name); m.__path__ = []; m.__version__ = "99.0"; return m
    def exec_module(self, m): pass
def _caller():
    f = sys._getframe(2)
    while f:
        g = f.f_globals.get("__name__", "")
        if g.startswith("sglang"): return g
        f = f.f_back
    return "?"
import torch
torch.cuda.is_available = lambda: True
torch.version.cuda = "13.0"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
props = types.SimpleNamespace(major=9, minor=0, name="NVIDIA H200", total_memory=143771 << 20, multi_processor_count=132, L2_cache_size=60 << 20)
torch.cuda.get_device_properties = lambda *a, **k: props
sys.meta_path.insert(0, Finder())
before = set(sys.modules)
# SGLang 0.5.23 replaced HiRadixCache (mem_cache/hiradix_cache) with mem_cache/unified_radix_cache
import importlib.util
_sgl = os.path.dirname(importlib.util.find_spec("sglang").origin)
_radix = "hiradix_cache" if os.path.exists(os.path.join(_sgl, "srt", "mem_cache", "hiradix_cache.py")) else "unified_radix_cache"
roots = sys.argv[1:] or f"""sglang.srt.server_args sglang.launch_server sglang.srt.entrypoints.http_server
    sglang.srt.managers.scheduler sglang.srt.managers.tokenizer_manager sglang.srt.managers.detokenizer_manager
    sglang.srt.model_executor.model_runner sglang.srt.models.qwen3 sglang.srt.layers.attention.flashattention_backend
    sglang.srt.mem_cache.{_radix} sglang.srt.mem_cache.storage.backend_factory sglang.srt.managers.cache_controller
    sglang.srt.entrypoints.openai.serving_completions sglang.srt.layers.sampler sglang.srt.batch_invariant_ops""".split()
errs = {}
import traceback
for r in roots:
    try:
        importlib.import_module(r)
    except ModuleNotFoundError as e:
        errs[r] = f"MISSING {e.name}\n" + "".join(l for l in traceback.format_exc().splitlines(True) if "File" in l)[-2500:]; break
    except BaseException as e:
        errs[r] = traceback.format_exc()[-1500:]; break
print("CORE", sorted(n for n in sys.modules if n.endswith("_core") and n.startswith("sglang")))
print("STUBBED (not installed here):")
for k, v in STUBBED.items(): print("  ", k, "<-", sorted(v)[:4])
used = collections.Counter()
for n, m in list(sys.modules.items()):
    f = getattr(m, "__file__", None) or ""
    if "site-packages" in f and "." not in n:
        used[n] = f.split("site-packages/")[0][-40:]
print("INSTALLED third-party top-level modules imported:", " ".join(sorted(used)))
for r, e in errs.items(): print("ERROR", r, e)
