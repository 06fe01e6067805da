"""Two real Triton autotuned kernels for tests/test_compile_cache.py (never launched: no GPU needed to define
them): one whose configs carry a pre_hook, as mamba-ssm's SSD backward kernels do, and one without."""

import triton
import triton.language as tl


def _zero(nargs):
    nargs["out"].zero_()


@triton.autotune(configs=[triton.Config({"BLOCK": b}, pre_hook=_zero) for b in (32, 64)], key=["n", "m", "flag"])
@triton.jit
def _bwd_kernel(out, n, m, flag, BLOCK: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (32, 64)], key=["n", "m", "flag"])
@triton.jit
def _fwd_kernel(out, n, m, flag, BLOCK: tl.constexpr):
    pass
