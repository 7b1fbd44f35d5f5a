"""Log each Triton compile of this process (kernel, whether compiled ahead, milliseconds, its
specialization) to a file: which kernels a step compiled at first use, and for which shapes.
Wraps ``JITFunction._do_compile`` (Triton >= 3.3); does nothing where that is missing. For a
compile ahead (kernels/compile_ahead.py) the time is only its hand-off to Triton's thread pool;
a compile at use is timed whole.

    from triton_compile_log import log_compiles
    log_compiles("compiles.txt")
"""

from __future__ import annotations

import time


def log_compiles(path: str) -> bool:
    """From now on, append one line per compile to ``path``; False if this Triton lacks the
    hook."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    orig = getattr(JITFunction, "_do_compile", None)
    if orig is None:
        return False
    t0 = time.perf_counter()

    def logged(self, key, signature, device, constexprs, options, attrs, warmup):
        t = time.perf_counter()
        out = orig(self, key, signature, device, constexprs, options, attrs, warmup)
        with open(path, "a") as f:
            f.write(f"{t - t0:9.3f} s  {getattr(self, '__name__', self)}  "
                    f"{'ahead' if warmup else 'AT USE'}  {(time.perf_counter() - t) * 1e3:8.1f} ms"
                    f"  constexprs={constexprs}  key={key}\n")
        return out

    JITFunction._do_compile = logged
    return True
