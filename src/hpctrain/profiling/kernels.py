"""What a kernel or operator is, from its name: the vocabulary of trace analysis.

GPU kernels carry no type in a Kineto trace, only a name, so classes come from name patterns,
the ones Holistic Trace Analysis and NVIDIA's documentation use (see shared/notes/anchors.md):
communication is NCCL; matrix work is GEMM and convolution kernels (cuBLAS, cuDNN, CUTLASS,
Hopper's nvjet and wgmma); Tensor Core kernels are recognised by their MMA tile or
instruction tokens; the precision comes from the same names.
"""

from __future__ import annotations

import re

COMPUTE, COMMUNICATION, MEMORY = 0, 1, 2
KIND_NAMES = ("compute", "communication", "memory")

_MATRIX = re.compile(r"gemm|conv|xmma|nvjet|wgmma|cutlass|winograd|fprop|dgrad|wgrad|"
                     r"hmma|imma|tensorop|\b[hsi]\d{3,5}|_\d{3,5}gemm", re.I)
_NOT_MATRIX = re.compile(r"batch_?norm|bn_fw|bn_bw|layer_?norm|softmax|elementwise|reduce", re.I)
_TENSOR_CORE = re.compile(r"h884|s884|h1688|s1688|hmma|imma|i8816|16816|xmma|tensorop|wgmma|"
                          r"nvjet|sm80_|sm86_|sm89_|sm90_|sm100_|tf32|bf16|f16f16|e4m3|e5m2",
                          re.I)
_PRECISIONS = (("fp8", re.compile(r"e4m3|e5m2|fp8|f8f8", re.I)),  # f8f8: torch's rowwise
               ("int8", re.compile(r"i8816|imma|int8|_i8", re.I)),
               ("bf16", re.compile(r"bf16|bfloat16", re.I)),
               ("tf32", re.compile(r"tf32", re.I)),
               ("fp16", re.compile(r"h884|h1688|hmma|f16|fp16|half|_hsh|_hhs", re.I)),
               ("fp32", re.compile(r"sgemm|scudnn|s884|s1688|f32|fp32|float", re.I)))

SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize",
                        "cudaEventSynchronize", "cudaMemcpy"})
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                          "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
                          "cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch"})
# Forward matrix operators whose recorded shapes decide Tensor Core friendliness.
MATRIX_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                        "aten::convolution"})
# The read behind .item(), .tolist(), float(t): on a GPU it waits for the device.
ITEM_OPS = frozenset({"aten::_local_scalar_dense"})
_COMM_OP = re.compile(r"^(nccl:|gloo:|c10d::|record_param_comms)")


def kernel_kind(category: str, name: str) -> int:
    if category in ("gpu_memcpy", "gpu_memset"):
        return MEMORY
    return COMMUNICATION if "nccl" in name.lower() else COMPUTE


def is_matrix(name: str) -> bool:
    return bool(_MATRIX.search(name)) and not _NOT_MATRIX.search(name)


def uses_tensor_cores(name: str) -> bool:
    return bool(_TENSOR_CORE.search(name)) and "sgemm" not in name.lower()


def precision(name: str) -> str | None:
    for label, pattern in _PRECISIONS:
        if pattern.search(name):
            return label
    return None


def is_comm_op(name: str) -> bool:
    return bool(_COMM_OP.match(name))


def blocking_copy(name: str) -> bool:
    """A device-to-host copy into pageable memory: the host waits for it to finish."""
    return name.startswith("Memcpy DtoH") and "Pageable" in name


def matrix_dims(op: str, dims: list) -> dict[str, int]:
    """The dimensions of a matrix operator that Tensor Cores want in multiples of 8 (M, N, K
    of a GEMM; input and output channels of a convolution), from its recorded input shapes.
    A convolution's input channels of 4 or fewer (an RGB image) are left out: cuDNN pads them
    and there is nothing to change."""
    try:
        if op == "aten::mm":
            (m, k), (_, n) = dims[0], dims[1]
        elif op == "aten::addmm":
            (m, k), (_, n) = dims[1], dims[2]
        elif op == "aten::bmm":
            (_, m, k), (_, _, n) = dims[0], dims[1]
        elif op == "aten::baddbmm":
            (_, m, k), (_, _, n) = dims[1], dims[2]
        elif op == "aten::convolution":
            channels, out = dims[0][1], dims[1][0]
            return {"out_channels": out, **({"in_channels": channels} if channels > 4 else {})}
        else:
            return {}
    except (IndexError, TypeError, ValueError):
        return {}
    return {"M": m, "N": n, "K": k}
