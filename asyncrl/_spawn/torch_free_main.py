"""The main module of a torch-free child (:func:`asyncrl._spawn.torch_free.start_torch_free`).

Run by multiprocessing as ``__mp_main__`` before the child unpickles its target: it
marks the process torch-free (``ASYNCRL_TORCH_FREE=1``) so that the imports that
follow (asyncrl, transports) leave torch and tensordict out. It imports nothing of
asyncrl itself.
"""

import os

# Only as a child's main module: an import (tests/test_layout.py imports every module)
# must not make the importing process torch-free, nor every process it starts after.
if __name__ in ("__mp_main__", "__main__"):
    os.environ["ASYNCRL_TORCH_FREE"] = "1"
