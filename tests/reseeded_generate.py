"""fairseq-generate with torch's random state reset to ``--seed`` before each batch.

Building a model draws random numbers for its initial weights (which the checkpoint then
replaces), and our model and fairseq's ``transformer`` draw different amounts, so with the same
``--seed`` sampling would start from different random states. Reseeding before each batch makes
every batch's sampling draws depend only on the seed and on the model's probabilities, so that
two implementations of the same function can be compared sample for sample, and a draw that
float rounding sends the other way changes its own batch only.

Usage: ``python tests/reseeded_generate.py DATA --seed N ...`` (fairseq-generate's arguments).
"""

import sys

import torch
from fairseq.tasks import FairseqTask
from fairseq_cli import generate


def main() -> None:
    seed = int(sys.argv[sys.argv.index("--seed") + 1])
    inference_step = FairseqTask.inference_step

    def reseeded_inference_step(self, *args, **kwargs):
        torch.manual_seed(seed)
        return inference_step(self, *args, **kwargs)

    FairseqTask.inference_step = reseeded_inference_step
    generate.cli_main()


if __name__ == "__main__":
    main()
