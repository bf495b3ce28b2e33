"""The precise trace: one training step of the real model code under PyTorch fake tensors."""

# The CPU build of torch first: a bare `pip install torch` pulls the multi-GB CUDA build on Linux
# (pytorch.org/get-started/locally, "Compute Platform: CPU"), and the trace never touches a GPU.
INSTALL_HINT = (
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (the CPU build), "
    "then pip install -e '.[trace]'"
)
