"""Startup trace for vLLM's compile_or_warm_up_model tail (diagnosis only).

Active when ORBITKV_STARTUP_TRACE names a file (appended to, one line per
event, every line prefixed with the wall time and pid). Put this file's
folder first on PYTHONPATH. Records, in every Python process:

- each Triton compile (knobs.compilation.listener): kernel name, cache hit or
  miss, the key hash, the seconds it took, the cache dir it used;
- the phases of the window between "Free memory on device" and "Kernel JIT
  monitor activated" (gpu_worker.compile_or_warm_up_model's tail):
  warmup_kernels and each execute_model / sample_tokens it runs,
  set_random_seed, trigger_inductor_lazy_init, jit_monitor.activate;
- the TRITON_* / TORCHINDUCTOR_* / VLLM_* environment when warmup_kernels starts;
- with ORBITKV_STARTUP_TRACE_STACKS=S (seconds, default 1; 0 = off): every
  thread's stack every S seconds while warmup_kernels runs (faulthandler).
"""

import os

_PATH = os.environ.get("ORBITKV_STARTUP_TRACE", "")

if _PATH:
    import faulthandler
    import functools
    import importlib.abc
    import importlib.util
    import sys
    import threading
    import time

    _lock = threading.Lock()
    _file = open(_PATH, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def _log(msg: str) -> None:
        with _lock:
            _file.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} pid={os.getpid()} {msg}\n")

    def _timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            _log(f"phase {name} begin")
            try:
                return fn(*a, **kw)
            finally:
                _log(f"phase {name} end {time.perf_counter() - t0:.3f}s")

        return wrapper

    def _listener(*, src, metadata, metadata_group, times, cache_hit, **_):
        try:
            from triton import knobs

            cache_dir = knobs.cache.dir
        except Exception:  # noqa: BLE001
            cache_dir = "?"
        total = getattr(times, "total", None)
        if total is None:  # CompileTimes: microseconds per stage
            total = sum(v for v in vars(times).values() if isinstance(v, (int, float))) if times is not None else -1
        _log(f"triton {'HIT ' if cache_hit else 'MISS'} {getattr(src, 'name', src)} hash={metadata.get('hash', '?')} "
             f"times={times!r} dir={cache_dir}")

    def _install_triton_listener() -> None:
        try:
            from triton import knobs
        except Exception as e:  # noqa: BLE001 - a CPU build without Triton
            _log(f"no triton listener: {e!r}")
            return
        prev = knobs.compilation.listener

        def chained(**kw):
            _listener(**kw)
            if prev is not None:
                prev(**kw)

        knobs.compilation.listener = chained
        _log("triton listener installed")

    def _env() -> str:
        keys = sorted(k for k in os.environ if k.startswith(("TRITON", "TORCHINDUCTOR", "VLLM", "TORCH_", "CUDA")))
        return " ".join(f"{k}={os.environ[k]}" for k in keys)

    def _patch_gpu_worker(mod) -> None:
        orig_warmup = getattr(mod, "warmup_kernels", None)
        if orig_warmup is not None:
            stacks = float(os.environ.get("ORBITKV_STARTUP_TRACE_STACKS", "1") or 0)

            @functools.wraps(orig_warmup)
            def warmup_kernels(model_runner, execute_model, sample_tokens, *a, **kw):
                _log(f"env {_env()}")
                n = {"execute_model": 0, "sample_tokens": 0}

                def counted(name, fn):
                    def call(*x, **y):
                        n[name] += 1
                        return _timed(f"warmup.{name}#{n[name]}", fn)(*x, **y)

                    return call

                if stacks > 0:
                    faulthandler.dump_traceback_later(stacks, repeat=True, file=_file)
                try:
                    return _timed("warmup_kernels", orig_warmup)(
                        model_runner, counted("execute_model", execute_model),
                        counted("sample_tokens", sample_tokens), *a, **kw)
                finally:
                    if stacks > 0:
                        faulthandler.cancel_dump_traceback_later()

            mod.warmup_kernels = warmup_kernels
        for name in ("set_random_seed", "maybe_save_startup_plan", "kernel_warmup"):
            fn = getattr(mod, name, None)
            if fn is not None:
                setattr(mod, name, _timed(name, fn))
        try:
            import vllm.compilation.compiler_interface as ci

            ci.trigger_inductor_lazy_init = _timed("trigger_inductor_lazy_init", ci.trigger_inductor_lazy_init)
        except Exception as e:  # noqa: BLE001
            _log(f"no compiler_interface patch: {e!r}")
        try:
            import vllm.utils.jit_monitor as jm

            jm.activate = _timed("jit_monitor.activate", jm.activate)
        except Exception as e:  # noqa: BLE001
            _log(f"no jit_monitor patch: {e!r}")
        _install_triton_listener()
        _log(f"patched {mod.__name__}")

    _TARGET = "vllm.v1.worker.gpu_worker"

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != _TARGET:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(fullname)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            orig_exec = loader.exec_module

            def exec_module(module):
                orig_exec(module)
                try:
                    _patch_gpu_worker(module)
                except Exception as e:  # noqa: BLE001 - never break the engine
                    _log(f"patch failed: {e!r}")

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
    _log(f"startup trace on: {' '.join(sys.argv)[:200]}")
