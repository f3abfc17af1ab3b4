"""`python -m gpulab ...`: the `gpulab` command where its console script is not installed (a GPU
node that runs from a checkout with PYTHONPATH=src)."""
import sys

from gpulab.cli import main

sys.exit(main())
