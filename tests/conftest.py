"""Test-session settings shared by every test module.

Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. when the kernel module
is first imported, so it has to be set here, before any test module imports it. The interpreter
runs the Triton kernels on CPU tensors (CUDA tensors are copied to the host and back). To test the
compiled kernels on a GPU instead, run ``TRITON_INTERPRET=0 python -m pytest``.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
