"""Test-session settings shared by every test module.

Triton reads TRITON_INTERPRET when ``@triton.jit`` decorates a kernel, i.e. when the kernel module
is first imported, so it has to be set here, before any test module imports it. The interpreter
runs the Triton kernels on CPU tensors (CUDA tensors are copied to the host and back). To test the
compiled kernels on a GPU instead, run ``TRITON_INTERPRET=0 python -m pytest``. Calibration's measurements are
not written to the user's cache from tests (``HF_DYNASPEC_MEASURE=memory``).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# calibration's measurements stay in the process (tests/test_measured.py tests the disk cache in a temporary folder)
os.environ.setdefault("HF_DYNASPEC_MEASURE", "memory")


import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (no oversubscription when the cores are busy); restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    """A tiny random Llama target (vocabulary 128, no EOS); see tests/helpers.py."""
    from helpers import tiny_target

    return tiny_target()


@pytest.fixture(scope="module")
def drafter(target):
    """A fresh DynaSpec drafter bound to `target` (8 clusters)."""
    from helpers import tiny_drafter

    return tiny_drafter(target)


@pytest.fixture(autouse=True)
def fresh_policies():
    """Each test's generate() calls start from the step policy's priors and a fresh layout learner, not from what
    another test's calls taught them (`hf_dynaspec.generation.planning.learned`, `calibration.forget_learners`), so no test
    depends on the order tests run in."""
    from hf_dynaspec.generation.planning.calibration import forget_learners
    from hf_dynaspec.generation.planning.learned import forget_policies

    forget_policies()
    forget_learners()
    yield
