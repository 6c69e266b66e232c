"""fairseq-generate with torch's random state reset to ``--seed`` once the models are loaded.

Building a model draws random numbers for its initial weights (which the checkpoint then
replaces), and our model and fairseq's ``transformer`` draw different amounts, so with the same
``--seed`` sampling would start from different random states. Reseeding after loading makes
the sampling draws depend only on the seed and on the model's probabilities, so that two
implementations of the same function can be compared sample for sample.

Usage: ``python tests/reseeded_generate.py DATA --seed N ...`` (fairseq-generate's arguments).
"""

import sys

import torch
from fairseq import checkpoint_utils
from fairseq_cli import generate


def main() -> None:
    seed = int(sys.argv[sys.argv.index("--seed") + 1])
    load = checkpoint_utils.load_model_ensemble

    def load_then_reseed(*args, **kwargs):
        loaded = load(*args, **kwargs)
        torch.manual_seed(seed)
        return loaded

    checkpoint_utils.load_model_ensemble = load_then_reseed
    generate.cli_main()


if __name__ == "__main__":
    main()
