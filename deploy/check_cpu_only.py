"""Fail an image build whose torch is a CUDA build (see the Dockerfile and docs/deploy.md).

A CPU-only image must not carry gigabytes of CUDA libraries: this exits 1, naming
what came, when torch was built with CUDA or any ``nvidia-*`` package is installed.
"""

from __future__ import annotations

import sys
from importlib import metadata


def cuda_problems() -> list[str]:
    import torch

    problems = []
    if torch.version.cuda:
        problems.append(f"torch {torch.__version__} is built with CUDA {torch.version.cuda}")
    nvidia = sorted(d.metadata["Name"] for d in metadata.distributions()
                    if (d.metadata["Name"] or "").lower().startswith("nvidia"))
    if nvidia:
        problems.append(f"CUDA packages are installed: {', '.join(nvidia)}")
    return problems


def main() -> int:
    problems = cuda_problems()
    for problem in problems:
        print(f"check_cpu_only: {problem}", file=sys.stderr)
    if problems:
        print("check_cpu_only: build with --build-arg TORCH_INDEX_URL=<PyTorch's CPU-only "
              "wheel index> (docs/deploy.md)", file=sys.stderr)
        return 1
    print("check_cpu_only: torch is a CPU-only build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
